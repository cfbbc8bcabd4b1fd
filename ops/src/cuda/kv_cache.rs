//! The paged KV cache of every layer on the GPU, in bf16.

use crate::KvRows;
use cudarc::driver::{CudaSlice, CudaStream, DriverError};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_runtime::cuda::{Gpu, GpuError};
use std::ops::Range;

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
        self.tensors() as u64 * self.layout.layer_elems() * 2
    }

    /// The caches a layer holds: K and V, or only K (the latent rows).
    fn tensors(&self) -> usize {
        match self.rows {
            KvRows::KeysAndValues => 2,
            KvRows::Latent => 1,
        }
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

    /// Elements of one block over every layer: its keys, then its values where the layer
    /// holds them, layer by layer (how [`GpuKvCache::gather_block`] lays them out).
    pub fn block_elems(&self) -> usize {
        self.tensors() * self.layers.len() * self.layer_block_elems()
    }

    /// Copies block `block` of every layer into `out` (at least [`GpuKvCache::block_elems`]
    /// long), queued on `stream`.
    pub fn gather_block(
        &self,
        stream: &std::sync::Arc<CudaStream>,
        block: u32,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), DriverError> {
        let (range, tensors) = (self.block_range(block), self.tensors());
        let mut at = 0;
        for (k, v) in &self.layers {
            for part in [k, v].into_iter().take(tensors) {
                let len = range.len();
                stream.memcpy_dtod(&part.slice(range.clone()), &mut out.slice_mut(at..at + len))?;
                at += len;
            }
        }
        Ok(())
    }

    /// Writes `from` (as [`GpuKvCache::gather_block`] laid it out) into block `block` of
    /// every layer, queued on `stream`.
    pub fn scatter_block(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        from: &CudaSlice<bf16>,
        block: u32,
    ) -> Result<(), DriverError> {
        let (range, tensors) = (self.block_range(block), self.tensors());
        let mut at = 0;
        for (k, v) in &mut self.layers {
            for part in [k, v].into_iter().take(tensors) {
                let len = range.len();
                stream.memcpy_dtod(
                    &from.slice(at..at + len),
                    &mut part.slice_mut(range.clone()),
                )?;
                at += len;
            }
        }
        Ok(())
    }

    /// Elements of one block in one layer's K (or V) cache.
    fn layer_block_elems(&self) -> usize {
        (self.layout.block_size * self.layout.slot_elems()) as usize
    }

    /// The elements of block `block` in a layer's K (or V) cache, in 64 bits.
    ///
    /// # Panics
    /// If `block` is outside the pool (the KV allocator hands out only the pool's ids).
    fn block_range(&self, block: u32) -> Range<usize> {
        assert!(
            u64::from(block) < self.layout.num_blocks,
            "block {block} outside a pool of {}",
            self.layout.num_blocks
        );
        let start = block as usize * self.layer_block_elems();
        start..start + self.layer_block_elems()
    }
}
