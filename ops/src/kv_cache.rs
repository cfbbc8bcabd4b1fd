//! The paged KV cache of every layer.

use half::bf16;
use peregrine_kernels::cpu::{self, KvLayout};

/// What one token leaves in a layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvRows {
    /// A key row and a value row (grouped-query attention).
    KeysAndValues,
    /// One row, the compressed latent and the rotary key, that latent attention reads as
    /// its keys and (its first part) as its values; no value cache is held.
    Latent,
}

/// The element a CPU KV cache stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// 4 bytes an element.
    Float32,
    /// 2 bytes an element: half the memory and the attention's reads (rounded to nearest
    /// even when written; f32's range, so nothing overflows).
    Bfloat16,
}

impl KvDtype {
    /// Bytes one element takes.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::Float32 => 4,
            KvDtype::Bfloat16 => 2,
        }
    }
}

/// Each layer's (K, V) caches in elements of `T`.
type LayerCaches<T> = Vec<(Vec<T>, Vec<T>)>;

/// Every layer's caches in one element type.
enum Layers {
    Float32(LayerCaches<f32>),
    Bfloat16(LayerCaches<bf16>),
}

/// K and V caches for every layer, each laid out `[num_blocks, block_size, kv_heads, head_dim]`
/// (under latent attention one cache of `[num_blocks, block_size, 1, latent + rope]`), in
/// float32 or bfloat16.
pub struct KvCache {
    layout: KvLayout,
    rows: KvRows,
    layers: Layers,
}

/// One layer's caches as the paged attention kernel reads them.
pub enum KvLayer<'a> {
    Float32(&'a [f32], &'a [f32]),
    Bfloat16(&'a [bf16], &'a [bf16]),
}

/// Allocates `num_layers` layers of (`n`, `values`) elements, every page written.
fn allocate<T: Copy>(
    num_layers: usize,
    n: usize,
    values: usize,
    zero: T,
) -> Result<LayerCaches<T>, std::collections::TryReserveError> {
    let zeros = |n: usize| -> Result<Vec<T>, std::collections::TryReserveError> {
        let mut layer = Vec::new();
        layer.try_reserve_exact(n)?;
        layer.resize(n, zero);
        Ok(layer)
    };
    (0..num_layers)
        .map(|_| Ok((zeros(n)?, zeros(values)?)))
        .collect()
}

impl KvCache {
    /// Allocates `num_layers` layers of `layout` (panics if the host cannot give them;
    /// the serving path uses [`KvCache::try_new`]).
    pub fn new(num_layers: usize, layout: KvLayout) -> KvCache {
        KvCache::try_new(num_layers, layout).expect("allocating the KV cache")
    }

    /// Allocates `num_layers` layers of `layout` and writes every page of them, so that
    /// the memory is really held from now on (as a GPU's is) rather than promised; an
    /// allocation the host refuses is an error, not an abort.
    pub fn try_new(
        num_layers: usize,
        layout: KvLayout,
    ) -> Result<KvCache, std::collections::TryReserveError> {
        KvCache::try_with(num_layers, layout, KvRows::KeysAndValues)
    }

    /// [`KvCache::try_new`] for a model whose tokens leave `rows` in each layer.
    pub fn try_with(
        num_layers: usize,
        layout: KvLayout,
        rows: KvRows,
    ) -> Result<KvCache, std::collections::TryReserveError> {
        let n = layout.layer_elems() as usize;
        let values = if rows == KvRows::Latent { 0 } else { n };
        Ok(KvCache {
            layout,
            rows,
            layers: Layers::Float32(allocate(num_layers, n, values, 0.0)?),
        })
    }

    /// [`KvCache::try_with`] storing keys and values as `dtype`; latent attention reads a
    /// float32 cache only, so a bfloat16 latent cache is refused.
    pub fn try_with_dtype(
        num_layers: usize,
        layout: KvLayout,
        rows: KvRows,
        dtype: KvDtype,
    ) -> anyhow::Result<KvCache> {
        let n = layout.layer_elems() as usize;
        let layers = match (dtype, rows) {
            (KvDtype::Float32, _) => return Ok(KvCache::try_with(num_layers, layout, rows)?),
            (KvDtype::Bfloat16, KvRows::Latent) => anyhow::bail!(
                "a latent-attention (MLA) model keeps its CPU cache in float32: \
                 --kv-cache-dtype bfloat16 is for models with key and value caches"
            ),
            (KvDtype::Bfloat16, KvRows::KeysAndValues) => {
                Layers::Bfloat16(allocate(num_layers, n, n, bf16::ZERO)?)
            }
        };
        Ok(KvCache {
            layout,
            rows,
            layers,
        })
    }

    /// The element the cache stores.
    pub fn dtype(&self) -> KvDtype {
        match self.layers {
            Layers::Float32(_) => KvDtype::Float32,
            Layers::Bfloat16(_) => KvDtype::Bfloat16,
        }
    }

    /// The per-layer layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// What a token leaves in each layer.
    pub fn rows(&self) -> KvRows {
        self.rows
    }

    /// Bytes of K plus V (or of the latent) for one layer.
    pub fn bytes_per_layer(&self) -> u64 {
        let caches = if self.rows == KvRows::Latent { 1 } else { 2 };
        caches * self.layout.layer_elems() * self.dtype().bytes()
    }

    /// Bytes one block holds over every layer: its keys and values (or its latent rows).
    pub fn block_bytes(&self) -> u64 {
        self.bytes_per_layer() / self.layout.num_blocks.max(1) * self.num_layers() as u64
    }

    /// Copies block `block` of every layer (keys, then values where held, layer by layer)
    /// into `out`, [`KvCache::block_bytes`] long.
    ///
    /// # Panics
    /// If `block` is outside the pool or `out` is not one block long.
    pub fn copy_block_out(&self, block: u32, out: &mut [u8]) {
        let mut at = 0;
        self.each_block_part(block, |part: &[u8]| {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        });
        assert_eq!(at, out.len(), "a block's bytes");
    }

    /// Writes `bytes` (as [`KvCache::copy_block_out`] gave them) into block `block` of
    /// every layer.
    ///
    /// # Panics
    /// If `block` is outside the pool or `bytes` is not one block long.
    pub fn copy_block_in(&mut self, block: u32, bytes: &[u8]) {
        assert_eq!(bytes.len() as u64, self.block_bytes(), "a block's bytes");
        let range = self.block_range(block);
        let mut at = 0;
        let mut take = |dst: &mut [u8]| {
            dst.copy_from_slice(&bytes[at..at + dst.len()]);
            at += dst.len();
        };
        match &mut self.layers {
            Layers::Float32(layers) => layers.iter_mut().for_each(|(k, v)| {
                take(bytemuck::cast_slice_mut(&mut k[range.clone()]));
                if !v.is_empty() {
                    take(bytemuck::cast_slice_mut(&mut v[range.clone()]));
                }
            }),
            Layers::Bfloat16(layers) => layers.iter_mut().for_each(|(k, v)| {
                take(bytemuck::cast_slice_mut(&mut k[range.clone()]));
                take(bytemuck::cast_slice_mut(&mut v[range.clone()]));
            }),
        }
    }

    /// Layers held.
    fn num_layers(&self) -> usize {
        match &self.layers {
            Layers::Float32(layers) => layers.len(),
            Layers::Bfloat16(layers) => layers.len(),
        }
    }

    /// The elements of block `block` in one layer's cache (64-bit arithmetic).
    fn block_range(&self, block: u32) -> std::ops::Range<usize> {
        assert!(
            u64::from(block) < self.layout.num_blocks,
            "block {block} outside the pool"
        );
        let elems = self.layout.block_size * self.layout.slot_elems();
        let start = u64::from(block) * elems;
        start as usize..(start + elems) as usize
    }

    /// Calls `f` with each part of block `block` as bytes, in the order
    /// [`KvCache::copy_block_out`] lays them out.
    fn each_block_part(&self, block: u32, mut f: impl FnMut(&[u8])) {
        let range = self.block_range(block);
        match &self.layers {
            Layers::Float32(layers) => layers.iter().for_each(|(k, v)| {
                f(bytemuck::cast_slice(&k[range.clone()]));
                if !v.is_empty() {
                    f(bytemuck::cast_slice(&v[range.clone()]));
                }
            }),
            Layers::Bfloat16(layers) => layers.iter().for_each(|(k, v)| {
                f(bytemuck::cast_slice(&k[range.clone()]));
                f(bytemuck::cast_slice(&v[range.clone()]));
            }),
        }
    }

    /// Layer `layer`'s K and V caches of a float32 cache (under latent attention the latent
    /// cache and an empty one).
    ///
    /// # Panics
    /// On a bfloat16 cache (latent attention and the draft heads build float32 ones; the
    /// paged attention reads [`KvCache::layer_of`]).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        match &self.layers {
            Layers::Float32(layers) => {
                let (k, v) = &layers[layer];
                (k, v)
            }
            Layers::Bfloat16(_) => panic!("float32 slices of a bfloat16 KV cache"),
        }
    }

    /// Layer `layer`'s K and V caches in the cache's element type.
    pub fn layer_of(&self, layer: usize) -> KvLayer<'_> {
        match &self.layers {
            Layers::Float32(layers) => KvLayer::Float32(&layers[layer].0, &layers[layer].1),
            Layers::Bfloat16(layers) => KvLayer::Bfloat16(&layers[layer].0, &layers[layer].1),
        }
    }

    /// Writes rows of `k` and `v` into the slots `slot_mapping` names (negative = skip).
    pub fn write(&mut self, layer: usize, slot_mapping: &[i64], k: &[f32], v: &[f32]) {
        assert_eq!(
            self.rows,
            KvRows::KeysAndValues,
            "keys and values into a latent cache"
        );
        match &mut self.layers {
            Layers::Float32(layers) => {
                let (kc, vc) = &mut layers[layer];
                cpu::write_kv(kc, vc, &self.layout, slot_mapping, k, v);
            }
            Layers::Bfloat16(layers) => {
                let (kc, vc) = &mut layers[layer];
                cpu::write_kv(kc, vc, &self.layout, slot_mapping, k, v);
            }
        }
    }

    /// Writes latent rows (`[rows, latent + rope]`) into the slots `slot_mapping` names
    /// (negative = skip).
    pub fn write_latent(&mut self, layer: usize, slot_mapping: &[i64], rows: &[f32]) {
        assert_eq!(
            self.rows,
            KvRows::Latent,
            "latent rows into a key/value cache"
        );
        match &mut self.layers {
            Layers::Float32(layers) => {
                cpu::write_rows(&mut layers[layer].0, &self.layout, slot_mapping, rows)
            }
            Layers::Bfloat16(layers) => {
                cpu::write_rows(&mut layers[layer].0, &self.layout, slot_mapping, rows)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KvCache, KvDtype, KvLayer, KvRows};
    use peregrine_kernels::cpu::KvLayout;

    fn layout() -> KvLayout {
        KvLayout {
            num_blocks: 3,
            block_size: 4,
            num_kv_heads: 2,
            head_dim: 8,
        }
    }

    #[test]
    fn a_bfloat16_cache_takes_half_the_bytes_and_rounds_what_it_is_given() {
        let f32s =
            KvCache::try_with_dtype(2, layout(), KvRows::KeysAndValues, KvDtype::Float32).unwrap();
        let mut half =
            KvCache::try_with_dtype(2, layout(), KvRows::KeysAndValues, KvDtype::Bfloat16).unwrap();
        assert_eq!(f32s.bytes_per_layer(), 2 * half.bytes_per_layer());
        assert_eq!(half.dtype(), KvDtype::Bfloat16);
        // Two rows: the first padded (slot -1, skipped), the second into slot 5.
        let rows: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 / 1000.0).collect();
        half.write(1, &[-1, 5], &rows, &rows);
        let row = &rows[16..];
        let KvLayer::Bfloat16(k, _) = half.layer_of(1) else {
            panic!("a bfloat16 layer");
        };
        let at = 5 * 16;
        for (got, want) in k[at..at + 16].iter().zip(row) {
            assert_eq!(got.to_f32(), half::bf16::from_f32(*want).to_f32());
        }
    }

    /// Fills `cache` with small integers (exact in bfloat16) that vary with the layer, K or
    /// V, the slot and the element.
    fn fill(cache: &mut KvCache, layers: usize, slots: usize) {
        let row = |l: usize, kv: usize, s: usize| -> Vec<f32> {
            (0..16)
                .map(|e| ((l * 7 + kv * 3 + s * 5 + e * 11) % 251) as f32)
                .collect()
        };
        for l in 0..layers {
            for s in 0..slots {
                cache.write(l, &[s as i64], &row(l, 0, s), &row(l, 1, s));
            }
        }
    }

    #[test]
    fn a_block_copied_out_and_in_moves_every_layer_s_keys_and_values_and_nothing_else() {
        for dtype in [KvDtype::Float32, KvDtype::Bfloat16] {
            let l = layout();
            let slots = (l.num_blocks * l.block_size) as usize;
            let mut cache = KvCache::try_with_dtype(3, l, KvRows::KeysAndValues, dtype).unwrap();
            fill(&mut cache, 3, slots);
            let before: Vec<Vec<f32>> = (0..3).map(|i| layer_values(&cache, i)).collect();
            let mut bytes = vec![0xA5u8; cache.block_bytes() as usize];
            assert_eq!(
                cache.block_bytes(),
                3 * 2 * l.block_size * 16 * dtype.bytes()
            );
            cache.copy_block_out(0, &mut bytes);
            cache.copy_block_in(2, &bytes);
            let block = (l.block_size * 16) as usize;
            for (i, old) in before.iter().enumerate() {
                let new = layer_values(&cache, i);
                let half = new.len() / 2;
                for (kv, (old, new)) in [(&old[..half], &new[..half]), (&old[half..], &new[half..])]
                    .into_iter()
                    .enumerate()
                {
                    assert_ne!(old[2 * block..], old[..block], "the blocks differ before");
                    assert_eq!(
                        new[2 * block..],
                        old[..block],
                        "{dtype:?} layer {i} part {kv}"
                    );
                    assert_eq!(
                        new[..2 * block],
                        old[..2 * block],
                        "{dtype:?}: other blocks kept"
                    );
                }
            }
        }
    }

    /// Layer `i`'s keys then values, as f32.
    fn layer_values(cache: &KvCache, i: usize) -> Vec<f32> {
        match cache.layer_of(i) {
            KvLayer::Float32(k, v) => k.iter().chain(v).copied().collect(),
            KvLayer::Bfloat16(k, v) => k.iter().chain(v).map(|x| x.to_f32()).collect(),
        }
    }

    #[test]
    fn a_bfloat16_latent_cache_is_refused() {
        let err = KvCache::try_with_dtype(1, layout(), KvRows::Latent, KvDtype::Bfloat16)
            .err()
            .unwrap();
        assert!(err.to_string().contains("float32"), "{err}");
    }
}
