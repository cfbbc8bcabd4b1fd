//! The paged KV cache of every layer on the GPU, in bf16.

use crate::KvRows;
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// K and V caches of every layer, each laid out `[num_blocks, block_size, kv_heads,
/// head_dim]` like the CPU cache, in bf16. Each layer's K and V are separate allocations,
/// addressed with 64-bit offsets however large they are. Under latent attention a layer
/// keeps one row a token (`[num_blocks, block_size, 1, latent + rope]`) in its K cache
/// and no values: its V cache is a single element that no kernel reads.
pub struct GpuKvCache {
    layout: KvLayout,
    rows: KvRows,
    layers: Vec<(CudaSlice<bf16>, CudaSlice<bf16>)>,
}

impl GpuKvCache {
    /// Allocates `num_layers` layers of `layout` (zeroed), keys and values.
    pub fn new(gpu: &Gpu, num_layers: usize, layout: KvLayout) -> Result<GpuKvCache, GpuError> {
        GpuKvCache::with_rows(gpu, num_layers, layout, KvRows::KeysAndValues)
    }

    /// Allocates `num_layers` layers of `layout` (zeroed) holding what `rows` says.
    pub fn with_rows(
        gpu: &Gpu,
        num_layers: usize,
        layout: KvLayout,
        rows: KvRows,
    ) -> Result<GpuKvCache, GpuError> {
        let n = layout.layer_elems() as usize;
        let values = match rows {
            KvRows::KeysAndValues => n,
            KvRows::Latent => 1,
        };
        let layers = (0..num_layers)
            .map(|_| Ok((gpu.zeros(n)?, gpu.zeros(values)?)))
            .collect::<Result<_, GpuError>>()?;
        Ok(GpuKvCache {
            layout,
            rows,
            layers,
        })
    }

    /// What each token leaves in a layer.
    pub fn rows(&self) -> KvRows {
        self.rows
    }

    /// The per-layer layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Bytes of K plus V (or of the latent rows) for one layer.
    pub fn bytes_per_layer(&self) -> u64 {
        let tensors = match self.rows {
            KvRows::KeysAndValues => 2,
            KvRows::Latent => 1,
        };
        tensors * self.layout.layer_elems() * 2
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `layer`'s K and V caches.
    pub fn layer(&self, layer: usize) -> (&CudaSlice<bf16>, &CudaSlice<bf16>) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Layer `layer`'s K and V caches, to write into.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut CudaSlice<bf16>, &mut CudaSlice<bf16>) {
        let (k, v) = &mut self.layers[layer];
        (k, v)
    }
}
