//! The launcher of the batch-invariant tensor-core products (`cuda/gemm_mma.cu`), which
//! --deterministic mode takes for every product whose depth is a multiple of
//! [`FIXED_MMA_CHUNK`] on a device with bf16 tensor cores: each output element is one chain
//! of `mma.sync` products over k in a fixed order, so its bits do not depend on the number
//! of rows or on the tile shape chosen for them, and the shape can follow the batch.

use super::GemmOutput;
use crate::cuda::CudaKernels;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError, LaunchConfig};
use half::bf16;

/// Elements of k in a chunk of the kernels (`GBI_CHUNK`): the depth must be a multiple.
pub const FIXED_MMA_CHUNK: usize = 32;

/// A tile shape of the kernels (`gemm_fixed_mma_m{rows}n{cols}_*` in the source): the rows
/// and columns of out a block computes, the rows and columns of each warp's part, the
/// stages of its ring in shared memory and the chunks of k a stage holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TileShape {
    rows: usize,
    cols: usize,
    warp_rows: usize,
    warp_cols: usize,
    stages: usize,
    chunks_per_stage: usize,
    x_shared: bool,
}

impl TileShape {
    /// Threads of a block: a warp per part.
    fn threads(&self) -> u32 {
        (32 * (self.rows / self.warp_rows) * (self.cols / self.warp_cols)) as u32
    }

    /// Dynamic shared memory of a block: each stage's chunks of 64 bytes a row, rows of w
    /// and, past tiles of 16 rows, of x.
    fn shared_bytes(&self) -> u32 {
        let x_rows = if self.x_shared { self.rows } else { 0 };
        let bytes =
            self.stages * self.chunks_per_stage * (x_rows + self.cols) * 2 * FIXED_MMA_CHUNK;
        bytes as u32
    }
}

/// The shapes compiled, in pairs for a bucket of rows: a narrow tile for grids that would
/// not fill the device, then a wide one.
const SHAPES: [TileShape; 6] = [
    shape(16, 16, 16, 8, 8, 8, false),
    shape(16, 32, 16, 8, 4, 8, true),
    shape(64, 16, 16, 16, 4, 4, true),
    shape(64, 32, 32, 16, 3, 4, true),
    shape(64, 64, 32, 32, 4, 1, true),
    shape(128, 128, 64, 32, 3, 1, true),
];

#[allow(clippy::too_many_arguments)]
const fn shape(
    rows: usize,
    cols: usize,
    warp_rows: usize,
    warp_cols: usize,
    stages: usize,
    chunks_per_stage: usize,
    x_shared: bool,
) -> TileShape {
    TileShape {
        rows,
        cols,
        warp_rows,
        warp_cols,
        stages,
        chunks_per_stage,
        x_shared,
    }
}

/// Whether products of depth `k` take these kernels on the device of `kernels`.
pub fn takes_fixed_mma(kernels: &CudaKernels, k: usize) -> bool {
    kernels.tensor_cores() && k.is_multiple_of(FIXED_MMA_CHUNK)
}

/// The tile shape for `m` rows and `n` columns on a device of `multiprocessors`: the bucket
/// of the rows (up to 16, up to 64, more), and in it the wide tile where its grid still
/// has blocks for every multiprocessor (two each for the streaming shapes of few rows).
fn shape_for(m: usize, n: usize, multiprocessors: usize) -> TileShape {
    let bucket = match m {
        0..=16 => 0,
        17..=64 => 2,
        _ => 4,
    };
    let (narrow, wide) = (SHAPES[bucket], SHAPES[bucket + 1]);
    let blocks = m.div_ceil(wide.rows) * n.div_ceil(wide.cols);
    let wanted = if m <= 64 { 2 } else { 1 } * multiprocessors;
    if blocks >= wanted {
        wide
    } else {
        narrow
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` through the kernel of the shape [`shape_for`] picks.
/// The caller checks the buffers' lengths; `k` must be a multiple of [`FIXED_MMA_CHUNK`].
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
        k.is_multiple_of(FIXED_MMA_CHUNK),
        "linear: the tensor-core kernel needs k % {FIXED_MMA_CHUNK} == 0, not {k}"
    );
    for (what, ptr) in [("x", x.device_ptr(stream).0), ("w", w.device_ptr(stream).0)] {
        assert!(
            ptr.is_multiple_of(16),
            "linear: {what} is not 16-byte aligned"
        );
    }
    let shape = shape_for(m, n, kernels.multiprocessors() as usize);
    let row_tiles = u32::try_from(m.div_ceil(shape.rows))
        .ok()
        .filter(|&tiles| tiles <= 65_535)
        .expect("linear: rows past the grid");
    let col_tiles = u32::try_from(n.div_ceil(shape.cols)).expect("linear: n past the grid");
    let name = format!(
        "gemm_fixed_mma_m{}n{}_{}",
        shape.rows,
        shape.cols,
        T::KERNEL_SUFFIX
    );
    let shared_bytes = shape.shared_bytes();
    kernels.grant_shared(&name, shared_bytes)?;
    let (m, n, k) = (m as i32, n as i32, k as i32);
    let mut launch = kernels.launch(stream, &name);
    launch.arg(x).arg(w).arg(out).arg(&m).arg(&n).arg(&k);
    let config = LaunchConfig {
        grid_dim: (col_tiles, row_tiles, 1),
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: shared_bytes,
    };
    // SAFETY: x holds m rows of k, w n rows of k and out m * n elements (checked by the
    // callers), x and w 16-byte aligned with k % 32 == 0 (checked above); every block
    // guards the rows and columns past m and n.
    unsafe { launch.launch(config) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_follow_the_rows_and_fill_the_device() {
        let h100 = 132;
        // Decode of one sequence: the Llama-3.2-1B shape's q (2048 columns) in tiles of 16
        // columns (128 blocks), its gate and up (16,384) and the LM head in tiles of 32.
        assert_eq!(shape_for(1, 2048, h100), SHAPES[0]);
        assert_eq!(shape_for(16, 16_384, h100), SHAPES[1]);
        assert_eq!(shape_for(1, 128_256, h100), SHAPES[1]);
        // Batch 64.
        assert_eq!(shape_for(17, 2048, h100), SHAPES[2]);
        assert_eq!(shape_for(64, 16_384, h100), SHAPES[3]);
        // Prefill: 128 x 128 tiles where they still give every multiprocessor a block.
        assert_eq!(shape_for(65, 2048, h100), SHAPES[4]);
        assert_eq!(shape_for(4096, 2048, h100), SHAPES[5]);
        assert_eq!(shape_for(1024, 2048, h100), SHAPES[4]);
    }

    #[test]
    fn shared_memory_stays_within_what_a_block_may_take() {
        for shape in SHAPES {
            assert!(shape.shared_bytes() <= 227 * 1024, "{shape:?}");
        }
        // The few-row tiles hold only w: 8 stages of 8 chunks of 16 rows, 64 KiB.
        assert_eq!(SHAPES[0].shared_bytes(), 64 * 1024);
        assert_eq!(SHAPES[5].shared_bytes(), 48 * 1024);
    }

    #[test]
    fn the_source_has_every_shape_and_the_chunk() {
        let source = include_str!("../../../cuda/gemm_mma.cu");
        let line = format!("#define GBI_CHUNK {FIXED_MMA_CHUNK} ");
        assert!(source.contains(&line), "gemm_mma.cu lacks `{line}`");
        let names: Vec<&str> = crate::cuda::kernel_names(source).collect();
        for shape in SHAPES {
            for suffix in [bf16::KERNEL_SUFFIX, f32::KERNEL_SUFFIX] {
                let name = format!("gemm_fixed_mma_m{}n{}_{suffix}", shape.rows, shape.cols);
                assert!(names.contains(&name.as_str()), "gemm_mma.cu lacks {name}");
                let bounds = format!("__launch_bounds__({}) {name}(", shape.threads());
                assert!(source.contains(&bounds), "gemm_mma.cu lacks `{bounds}`");
                let template = format!(
                    "{{ gemm_fixed_mma<{}, {}, {}, {}, {}, {}, {}>(",
                    shape.rows,
                    shape.cols,
                    shape.warp_rows,
                    shape.warp_cols,
                    shape.stages,
                    shape.chunks_per_stage,
                    shape.x_shared
                );
                let line = source.lines().find(|line| line.contains(&bounds)).unwrap();
                assert!(line.contains(&template), "{name} is not {template}");
            }
        }
    }
}
