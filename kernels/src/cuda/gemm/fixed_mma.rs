//! The launcher of the batch-invariant tensor-core products (`cuda/gemm_mma.cu`), which
//! --deterministic mode takes for every product whose depth allows them
//! ([`takes_fixed_mma`]) on a device with bf16 tensor cores: each output element is summed in
//! an order fixed by k alone (stretches of [`FIXED_MMA_STRETCH`] chunks, each one chain of
//! `mma.sync` products, added in order), so its bits do not depend on the number of rows or
//! on the kernel and tile chosen for them, and those can follow the batch.

use super::{check_aligned, GemmOutput};
use crate::cuda::CudaKernels;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError, LaunchConfig};
use half::bf16;

/// Elements of k in a chunk of the kernels (`GBI_CHUNK`): the depth must be a multiple.
pub const FIXED_MMA_CHUNK: usize = 32;

/// Chunks of a stretch (`GBI_STRETCH`), the k each chain of products sums.
pub const FIXED_MMA_STRETCH: usize = 16;

/// The most stretches a depth may have (`GBI_MAX_STRETCHES`: the split kernel's shared
/// memory holds one sum of each).
const MAX_STRETCHES: usize = 64;

/// The stretches of a depth `k` (a multiple of [`FIXED_MMA_CHUNK`]).
fn stretches(k: usize) -> usize {
    (k / FIXED_MMA_CHUNK).div_ceil(FIXED_MMA_STRETCH)
}

/// A kernel of the split family (`gemm_fixed_mma_split_n{cols}w{warps}_*`): up to 64 rows,
/// a group of 16 rows and `cols` columns a block, its `warps` warps taking the stretches in
/// turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    cols: usize,
    warps: usize,
}

/// A tile shape of the tiled family (`gemm_fixed_mma_m{rows}n{cols}_*` in the source): the
/// rows and columns of out a block computes, the rows and columns of each warp's part, the
/// stages of its ring in shared memory and the chunks of k a stage holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    rows: usize,
    cols: usize,
    warp_rows: usize,
    warp_cols: usize,
    stages: usize,
    chunks_per_stage: usize,
}

/// The kernel of one product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Split(Split),
    Tile(Tile),
}

impl Kernel {
    /// The kernel's name, less its output type.
    fn name(&self) -> String {
        match self {
            Kernel::Split(s) => format!("gemm_fixed_mma_split_n{}w{}", s.cols, s.warps),
            Kernel::Tile(t) => format!("gemm_fixed_mma_m{}n{}", t.rows, t.cols),
        }
    }

    /// Threads of a block.
    fn threads(&self) -> u32 {
        let warps = match self {
            Kernel::Split(s) => s.warps,
            Kernel::Tile(t) => (t.rows / t.warp_rows) * (t.cols / t.warp_cols),
        };
        32 * warps as u32
    }

    /// Dynamic shared memory of a block for a depth of `k`: the split kernel's sum of each
    /// stretch (16 rows of f32), the tiled kernel's stages of chunks of 64 bytes a row.
    fn shared_bytes(&self, k: usize) -> u32 {
        let bytes = match self {
            Kernel::Split(s) => stretches(k) * 16 * s.cols * 4,
            Kernel::Tile(t) => {
                t.stages * t.chunks_per_stage * (t.rows + t.cols) * 2 * FIXED_MMA_CHUNK
            }
        };
        bytes as u32
    }

    /// The blocks of the grid, x and y: the split kernel's groups of 16 rows and its column
    /// tiles (the groups of one column tile side by side); the tiled kernel's column tiles
    /// and row tiles.
    fn grid(&self, m: usize, n: usize) -> (usize, usize) {
        match self {
            Kernel::Split(s) => (m.div_ceil(SPLIT_ROWS), n.div_ceil(s.cols)),
            Kernel::Tile(t) => (n.div_ceil(t.cols), m.div_ceil(t.rows)),
        }
    }
}

/// Rows of a block of the split kernels (one `mma` tile's).
const SPLIT_ROWS: usize = 16;

/// The most rows the split kernels take: more take the tiles.
const SPLIT_MAX_ROWS: usize = 64;

/// The split kernels compiled: columns 8, 16 or 32, warps 4 or 8.
const SPLITS: [Split; 6] = [
    split(8, 4),
    split(8, 8),
    split(16, 4),
    split(16, 8),
    split(32, 4),
    split(32, 8),
];

/// The tile shapes compiled: one, for more rows than the split kernels take (prefill). A
/// tile of 128 x 64 rows and columns measured slower there (91 against 77 ms for the
/// prefill of 4,000 tokens of the Llama-3.2-1B shape on an H100): its warps keep the sum of
/// the stretches before beside the running chain, and 152 registers a thread leave one
/// block of 8 warps a multiprocessor. Tiles of 64 rows and 16 or 32 columns took 17 to 64
/// rows before the split kernels' groups of rows, at half their speed and less.
const TILES: [Tile; 1] = [tile(64, 64, 32, 32, 4, 1)];

const fn split(cols: usize, warps: usize) -> Split {
    Split { cols, warps }
}

const fn tile(
    rows: usize,
    cols: usize,
    warp_rows: usize,
    warp_cols: usize,
    stages: usize,
    chunks_per_stage: usize,
) -> Tile {
    Tile {
        rows,
        cols,
        warp_rows,
        warp_cols,
        stages,
        chunks_per_stage,
    }
}

/// Whether products of depth `k` take these kernels on the device of `kernels`: a multiple
/// of [`FIXED_MMA_CHUNK`] of at most 64 stretches (32,768). A choice by k alone.
pub fn takes_fixed_mma(kernels: &CudaKernels, k: usize) -> bool {
    kernels.tensor_cores() && k.is_multiple_of(FIXED_MMA_CHUNK) && stretches(k) <= MAX_STRETCHES
}

/// The kernel for `m` rows, `n` columns and depth `k` on a device of `multiprocessors`. Up
/// to 64 rows the split kernel, with 4 warps where k has at most 4 stretches (8 otherwise)
/// and the widest column tile (32, 16, then 8) whose grid still gives each multiprocessor
/// two blocks; more rows the 64 x 64 tile.
fn kernel_for(m: usize, n: usize, k: usize, multiprocessors: usize) -> Kernel {
    if m > SPLIT_MAX_ROWS {
        return Kernel::Tile(TILES[0]);
    }
    let groups = m.div_ceil(SPLIT_ROWS);
    let width = [32, 16]
        .into_iter()
        .position(|cols| groups * n.div_ceil(cols) >= 2 * multiprocessors)
        .map_or(0, |wide| 2 - wide);
    let warps_8 = stretches(k) > 4;
    Kernel::Split(SPLITS[2 * width + usize::from(warps_8)])
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` through the kernel [`kernel_for`] picks. The caller
/// checks the buffers' lengths and that [`takes_fixed_mma`] holds for `k`.
#[allow(clippy::too_many_arguments)]
pub fn fixed_mma_linear<T: GemmOutput>(
    kernels: &CudaKernels,
    stream: &CudaStream,
    x: &CudaView<bf16>,
    w: &CudaView<bf16>,
    out: &mut CudaViewMut<T>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), DriverError> {
    assert!(
        k.is_multiple_of(FIXED_MMA_CHUNK) && stretches(k) <= MAX_STRETCHES,
        "linear: the tensor-core kernels take depths that are multiples of \
         {FIXED_MMA_CHUNK} up to {MAX_STRETCHES} stretches, not {k}"
    );
    check_aligned([x.device_ptr(stream).0, w.device_ptr(stream).0]);
    let kernel = kernel_for(m, n, k, kernels.multiprocessors() as usize);
    let (grid_x, grid_y) = kernel.grid(m, n);
    let grid_x = u32::try_from(grid_x).expect("linear: past the grid");
    let grid_y = u32::try_from(grid_y)
        .ok()
        .filter(|&tiles| tiles <= 65_535)
        .expect("linear: past the grid's second dimension");
    let name = format!("{}_{}", kernel.name(), T::KERNEL_SUFFIX);
    let shared_bytes = kernel.shared_bytes(k);
    kernels.grant_shared(&name, shared_bytes)?;
    let (m, n, k) = (m as i32, n as i32, k as i32);
    let mut launch = kernels.launch(stream, &name);
    launch.arg(x).arg(w).arg(out).arg(&m).arg(&n).arg(&k);
    let config = LaunchConfig {
        grid_dim: (grid_x, grid_y, 1),
        block_dim: (kernel.threads(), 1, 1),
        shared_mem_bytes: shared_bytes,
    };
    // SAFETY: x holds m rows of k, w n rows of k and out m * n elements (checked by the
    // callers), x and w 16-byte aligned with k % 32 == 0 and at most 64 stretches (checked
    // above), the shared memory the kernel's family needs for k; every block guards the
    // rows and columns past m and n.
    unsafe { launch.launch(config) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_follow_the_rows_and_fill_the_device() {
        let h100 = 132;
        let split = |cols, warps| Kernel::Split(super::split(cols, warps));
        // Decode of one sequence, the Llama-3.2-1B shape: q and o (2,048 columns of depth
        // 2,048, four stretches) in blocks of 8 columns and 4 warps, 256 blocks; the down
        // projection (depth 8,192) with 8 warps; q, k and v together (3,072 columns) in 8,
        // since 16 would leave the grid 192 blocks; gate and up (16,384 columns) and the LM
        // head in blocks of 32.
        assert_eq!(kernel_for(1, 2048, 2048, h100), split(8, 4));
        assert_eq!(kernel_for(1, 2048, 8192, h100), split(8, 8));
        assert_eq!(kernel_for(1, 3072, 2048, h100), split(8, 4));
        assert_eq!(kernel_for(16, 16_384, 2048, h100), split(32, 4));
        assert_eq!(kernel_for(1, 128_256, 2048, h100), split(32, 4));
        // Batch 64: four groups of 16 rows, so the column tiles widen sooner.
        assert_eq!(kernel_for(17, 2048, 2048, h100), split(8, 4));
        assert_eq!(kernel_for(64, 2048, 2048, h100), split(16, 4));
        assert_eq!(kernel_for(64, 3072, 8192, h100), split(32, 8));
        assert_eq!(kernel_for(64, 16_384, 2048, h100), split(32, 4));
        assert_eq!(Kernel::Split(super::split(16, 4)).grid(64, 2048), (4, 128));
        // Prefill.
        assert_eq!(kernel_for(65, 2048, 2048, h100), Kernel::Tile(TILES[0]));
        assert_eq!(
            kernel_for(4096, 128_256, 2048, h100),
            Kernel::Tile(TILES[0])
        );
    }

    #[test]
    fn depths_are_cut_into_stretches_of_512() {
        assert_eq!(stretches(576), 2);
        assert_eq!(stretches(2048), 4);
        assert_eq!(stretches(8192), 16);
        assert_eq!(stretches(32_768), MAX_STRETCHES);
        assert_eq!(stretches(32_800), MAX_STRETCHES + 1);
    }

    #[test]
    fn shared_memory_stays_within_what_a_block_may_take() {
        let deepest = MAX_STRETCHES * FIXED_MMA_STRETCH * FIXED_MMA_CHUNK;
        for kernel in SPLITS
            .map(Kernel::Split)
            .into_iter()
            .chain(TILES.map(Kernel::Tile))
        {
            assert!(kernel.shared_bytes(deepest) <= 227 * 1024, "{kernel:?}");
        }
        // The split kernel holds each stretch's sum of 16 rows: 64 stretches of 32 columns
        // take 128 KiB.
        assert_eq!(Kernel::Split(SPLITS[5]).shared_bytes(deepest), 128 * 1024);
        assert_eq!(Kernel::Tile(TILES[0]).shared_bytes(deepest), 32 * 1024);
    }

    /// The template arguments of `kernel`'s line in the source (every split kernel
    /// prefetches 4 chunks).
    fn template(kernel: &Kernel) -> String {
        match kernel {
            Kernel::Split(s) => format!("gemm_fixed_mma_split<{}, {}, 4>(", s.cols, s.warps),
            Kernel::Tile(t) => format!(
                "gemm_fixed_mma<{}, {}, {}, {}, {}, {}>(",
                t.rows, t.cols, t.warp_rows, t.warp_cols, t.stages, t.chunks_per_stage
            ),
        }
    }

    #[test]
    fn the_source_has_every_kernel_and_constant() {
        let source = include_str!("../../../cuda/gemm_mma.cu");
        for line in [
            format!("#define GBI_CHUNK {FIXED_MMA_CHUNK} "),
            format!("#define GBI_STRETCH {FIXED_MMA_STRETCH} "),
            format!("#define GBI_MAX_STRETCHES {MAX_STRETCHES} "),
        ] {
            assert!(source.contains(&line), "gemm_mma.cu lacks `{line}`");
        }
        let names: Vec<&str> = crate::cuda::kernel_names(source).collect();
        for kernel in SPLITS
            .map(Kernel::Split)
            .into_iter()
            .chain(TILES.map(Kernel::Tile))
        {
            for suffix in [bf16::KERNEL_SUFFIX, f32::KERNEL_SUFFIX] {
                let name = format!("{}_{suffix}", kernel.name());
                assert!(names.contains(&name.as_str()), "gemm_mma.cu lacks {name}");
                let bounds = format!("__launch_bounds__({}) {name}(", kernel.threads());
                let line = source
                    .lines()
                    .find(|line| line.contains(&bounds))
                    .unwrap_or_else(|| panic!("gemm_mma.cu lacks `{bounds}`"));
                let template = template(&kernel);
                assert!(line.contains(&template), "{name} is not {template}");
            }
        }
    }
}
