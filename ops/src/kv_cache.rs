//! The paged KV cache of every layer.

use peregrine_kernels::cpu::{self, KvLayout};

/// K and V caches for every layer, each laid out `[num_blocks, block_size, kv_heads, head_dim]`.
pub struct KvCache {
    layout: KvLayout,
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
        let n = layout.layer_elems() as usize;
        let zeros = || -> Result<Vec<f32>, std::collections::TryReserveError> {
            let mut layer = Vec::new();
            layer.try_reserve_exact(n)?;
            layer.resize(n, 0.0);
            Ok(layer)
        };
        let layers = (0..num_layers)
            .map(|_| Ok((zeros()?, zeros()?)))
            .collect::<Result<_, std::collections::TryReserveError>>()?;
        Ok(KvCache { layout, layers })
    }

    /// The per-layer layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Bytes of K plus V for one layer.
    pub fn bytes_per_layer(&self) -> u64 {
        2 * self.layout.layer_elems() * 4
    }

    /// Layer `layer`'s K and V caches.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Writes rows of `k` and `v` into the slots `slot_mapping` names (negative = skip).
    pub fn write(&mut self, layer: usize, slot_mapping: &[i64], k: &[f32], v: &[f32]) {
        let (kc, vc) = &mut self.layers[layer];
        cpu::write_kv(kc, vc, &self.layout, slot_mapping, k, v);
    }
}
