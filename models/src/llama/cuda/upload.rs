//! Weights onto the device: read ones rounded to bf16 (`to_device`), or random ones made
//! there (`RandomWeights`), and why either failed.

use crate::weights::WeightError;
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cuda::elementwise::fill_uniform;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// Why the weights could not be put on the device.
#[derive(Debug, thiserror::Error)]
pub enum GpuWeightError {
    #[error(transparent)]
    Weight(#[from] WeightError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("CUDA: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// `values` rounded to bf16 on the device.
pub(crate) fn to_device(gpu: &Gpu, values: &[f32]) -> Result<CudaSlice<bf16>, GpuError> {
    let host: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
    gpu.upload(&host)
}

/// Random weights made on the device, each matrix from the next of a sequence of seeds.
pub struct RandomWeights<'a> {
    gpu: &'a Gpu,
    kernels: &'a CudaKernels,
    seed: u64,
}

impl<'a> RandomWeights<'a> {
    /// Weights on `gpu` made by `kernels`, the first from the seed after `seed`.
    pub fn new(gpu: &'a Gpu, kernels: &'a CudaKernels, seed: u64) -> RandomWeights<'a> {
        RandomWeights { gpu, kernels, seed }
    }

    /// The device the weights are made on.
    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    /// A `[rows, cols]` matrix uniform in `±scale`.
    pub fn matrix(
        &mut self,
        rows: usize,
        cols: usize,
        scale: f32,
    ) -> Result<CudaSlice<bf16>, GpuWeightError> {
        let mut m = self.gpu.zeros::<bf16>(rows * cols)?;
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let (stream, out) = (self.gpu.stream(), &mut m.as_view_mut());
        fill_uniform(self.kernels, stream, out, self.seed, scale)?;
        Ok(m)
    }

    /// A linear layer's `[rows, cols]` weight, uniform in `±1/sqrt(cols)` (its fan-in).
    pub fn linear(&mut self, rows: usize, cols: usize) -> Result<CudaSlice<bf16>, GpuWeightError> {
        self.matrix(rows, cols, 1.0 / (cols as f32).sqrt())
    }

    /// A linear layer's `[rows, cols]` weight in f32, uniform in `±1/sqrt(cols)`, made on
    /// the host (for the few weights kept in f32).
    pub fn f32_linear(
        &mut self,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<f32>, GpuWeightError> {
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let scale = 1.0 / (cols as f64).sqrt();
        let mut state = self.seed | 1;
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                // xorshift64*: uniform in [0, 1), then in ±scale.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let u =
                    (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
                ((2.0 * u - 1.0) * scale) as f32
            })
            .collect();
        Ok(self.gpu.upload(&values)?)
    }

    /// `n` ones (a norm's weight).
    pub fn ones(&self, n: usize) -> Result<CudaSlice<bf16>, GpuWeightError> {
        Ok(self.gpu.upload(&vec![bf16::ONE; n])?)
    }
}
