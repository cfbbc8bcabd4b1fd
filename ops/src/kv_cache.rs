//! The paged KV cache of every layer.

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

/// K and V caches for every layer, each laid out `[num_blocks, block_size, kv_heads, head_dim]`
/// (under latent attention one cache of `[num_blocks, block_size, 1, latent + rope]`).
pub struct KvCache {
    layout: KvLayout,
    rows: KvRows,
    layers: Vec<(Vec<f32>, Vec<f32>)>,
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
        let zeros = |n: usize| -> Result<Vec<f32>, std::collections::TryReserveError> {
            let mut layer = Vec::new();
            layer.try_reserve_exact(n)?;
            layer.resize(n, 0.0);
            Ok(layer)
        };
        let values = if rows == KvRows::Latent { 0 } else { n };
        let layers = (0..num_layers)
            .map(|_| Ok((zeros(n)?, zeros(values)?)))
            .collect::<Result<_, std::collections::TryReserveError>>()?;
        Ok(KvCache {
            layout,
            rows,
            layers,
        })
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
        caches * self.layout.layer_elems() * 4
    }

    /// Layer `layer`'s K and V caches (under latent attention the latent cache and an
    /// empty one).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Writes rows of `k` and `v` into the slots `slot_mapping` names (negative = skip).
    pub fn write(&mut self, layer: usize, slot_mapping: &[i64], k: &[f32], v: &[f32]) {
        assert_eq!(
            self.rows,
            KvRows::KeysAndValues,
            "keys and values into a latent cache"
        );
        let (kc, vc) = &mut self.layers[layer];
        cpu::write_kv(kc, vc, &self.layout, slot_mapping, k, v);
    }

    /// Writes latent rows (`[rows, latent + rope]`) into the slots `slot_mapping` names
    /// (negative = skip).
    pub fn write_latent(&mut self, layer: usize, slot_mapping: &[i64], rows: &[f32]) {
        assert_eq!(
            self.rows,
            KvRows::Latent,
            "latent rows into a key/value cache"
        );
        cpu::write_rows(&mut self.layers[layer].0, &self.layout, slot_mapping, rows);
    }
}
