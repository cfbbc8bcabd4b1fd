//! Launchers of the whole-block copies between a GPU pool and a staging buffer
//! (`cuda/kv_blocks.cu`), which the host tier below the pool moves its blocks through.

use super::CudaKernels;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DriverError, LaunchConfig};
use half::bf16;

/// Threads per (part, entry) block (`KV_BLOCKS_THREADS`).
const THREADS: u32 = 256;

/// Which way the blocks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockCopy {
    /// From the pool into the staging buffer.
    Gather,
    /// From the staging buffer into the pool.
    Scatter,
}

/// The pool the blocks are copied out of or into: the base address of each of its caches
/// (every layer's K, then V where held), on the device, and its blocks' shape.
pub struct PoolParts<'a> {
    /// The caches' base addresses, in the order a block's copy holds them.
    pub parts: &'a CudaSlice<u64>,
    /// Elements of one block in one cache (a multiple of 8).
    pub block_elems: usize,
    /// Blocks in each cache.
    pub num_blocks: u64,
}

/// Copies the pool blocks `blocks[..count]` between every cache of `pool` and `staging`
/// (entry e's copy at element `e * parts * block_elems`, cache after cache), the way
/// `copy` says, queued on `stream`.
///
/// # Panics
/// If an id is not below the pool's blocks (the caller checks them on its host copy, which
/// it passes as `host_blocks`), `staging` is shorter than `count` copies, or a block's part
/// is not a whole number of 16-byte pieces.
pub fn copy_kv_blocks(
    k: &CudaKernels,
    stream: &CudaStream,
    copy: BlockCopy,
    pool: &PoolParts,
    blocks: &CudaView<u32>,
    host_blocks: &[u32],
    staging: &mut CudaSlice<bf16>,
) -> Result<(), DriverError> {
    let count = host_blocks.len();
    let parts = pool.parts.len();
    assert!(
        pool.block_elems.is_multiple_of(8),
        "copy_kv_blocks: a block's part of {} elements is not whole 16-byte pieces",
        pool.block_elems
    );
    assert!(blocks.len() >= count, "copy_kv_blocks: short device ids");
    assert!(
        staging.len() >= count * parts * pool.block_elems,
        "copy_kv_blocks: staging holds fewer than {count} blocks"
    );
    if let Some(bad) = host_blocks
        .iter()
        .find(|&&b| u64::from(b) >= pool.num_blocks)
    {
        panic!(
            "copy_kv_blocks: block {bad} outside a pool of {}",
            pool.num_blocks
        );
    }
    if count == 0 || parts == 0 {
        return Ok(());
    }
    let name = match copy {
        BlockCopy::Gather => "kv_blocks_gather",
        BlockCopy::Scatter => "kv_blocks_scatter",
    };
    let block_elems = pool.block_elems as i64;
    let num_blocks = pool.num_blocks as i64;
    let mut launch = k.launch(stream, name);
    launch
        .arg(pool.parts)
        .arg(&block_elems)
        .arg(blocks)
        .arg(&num_blocks)
        .arg(staging);
    let config = LaunchConfig {
        grid_dim: (
            u32::try_from(parts).expect("copy_kv_blocks: parts past the grid"),
            u32::try_from(count)
                .ok()
                .filter(|&c| c <= 65_535)
                .expect("copy_kv_blocks: more than 65,535 blocks at once"),
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `parts` holds the base addresses of caches of `num_blocks` blocks of
    // `block_elems` elements each (the caller's, PoolParts), every id of the first `count`
    // is below `num_blocks` (checked above on the host copy; the kernel skips any other),
    // staging holds `count` copies of every part (checked above), and block_elems is a
    // multiple of 8, so every piece is a whole 16-byte one of 16-byte aligned allocations.
    // The caches are written (Scatter) through their addresses on this stream, which the
    // caller orders with every other use of them.
    unsafe { launch.launch(config) }
}

#[cfg(test)]
mod tests {
    use super::THREADS;

    #[test]
    fn the_source_agrees_with_the_launcher_constants() {
        let source = include_str!("../../cuda/kv_blocks.cu");
        assert!(source.contains(&format!("#define KV_BLOCKS_THREADS {THREADS}\n")));
        for name in ["kv_blocks_gather", "kv_blocks_scatter"] {
            assert!(
                source.contains(&format!("{name}(")),
                "kv_blocks.cu lacks {name}"
            );
        }
    }
}
