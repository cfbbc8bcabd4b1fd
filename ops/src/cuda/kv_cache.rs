//! The paged KV cache of every layer on the GPU, in bf16.

use crate::KvRows;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DriverError};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::kv_blocks::{copy_kv_blocks, BlockCopy, PoolParts};
use peregrine_kernels::cuda::CudaKernels;
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
    /// The base address of every layer's K cache, then V where held, layer by layer, on the
    /// device: what [`GpuKvCache::copy_blocks`] copies a block of.
    parts: CudaSlice<u64>,
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
        let layers: Vec<(CudaSlice<bf16>, CudaSlice<bf16>)> = (0..num_layers)
            .map(|_| Ok((gpu.zeros(n)?, gpu.zeros(values)?)))
            .collect::<Result<_, GpuError>>()?;
        let addresses: Vec<u64> = layers
            .iter()
            .flat_map(|(k, v)| [k, v].into_iter().take(tensors(rows)))
            .map(|part| part.device_ptr(gpu.stream()).0)
            .collect();
        let parts = gpu.upload(&addresses)?;
        Ok(GpuKvCache {
            layout,
            rows,
            layers,
            parts,
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

    /// The caches a layer holds.
    fn tensors(&self) -> usize {
        tensors(self.rows)
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
    /// holds them, layer by layer (how [`GpuKvCache::copy_blocks`] lays a block out).
    pub fn block_elems(&self) -> usize {
        self.tensors() * self.layers.len() * self.layer_block_elems()
    }

    /// Copies the blocks `host_blocks` (also on the device as `blocks`) between every
    /// layer and `staging`, [`GpuKvCache::block_elems`] a block in their order, the way
    /// `copy` says, queued on `stream`.
    ///
    /// # Panics
    /// If an id is outside the pool (the KV allocator hands out only the pool's ids; the
    /// host tier checks them first).
    pub fn copy_blocks(
        &mut self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        copy: BlockCopy,
        blocks: &CudaView<u32>,
        host_blocks: &[u32],
        staging: &mut CudaSlice<bf16>,
    ) -> Result<(), DriverError> {
        let pool = PoolParts {
            parts: &self.parts,
            block_elems: self.layer_block_elems(),
            num_blocks: self.layout.num_blocks,
        };
        copy_kv_blocks(kernels, stream, copy, &pool, blocks, host_blocks, staging)
    }

    /// Elements of one block in one layer's K (or V) cache.
    fn layer_block_elems(&self) -> usize {
        (self.layout.block_size * self.layout.slot_elems()) as usize
    }
}

/// The caches a layer holds: K and V, or only K (the latent rows).
fn tensors(rows: KvRows) -> usize {
    match rows {
        KvRows::KeysAndValues => 2,
        KvRows::Latent => 1,
    }
}
