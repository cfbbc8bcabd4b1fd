//! The features a draft head on the GPU is fed for a step, staged on the device: the
//! target's states (bf16, copied from the host or gathered from the feature ring) for step
//! 0, or each row's previous `pre` (f32) for the steps after it.

use crate::eagle3::feature_ring::FeatureRing;
use crate::eagle3::HeadInput;
use crate::llama::cuda::GpuForwardError;
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// A head's staged features, at its largest step.
pub struct StagedFeatures {
    /// bf16 `[tokens, aux width]`: the staged target states of a step fed them.
    pub aux: CudaSlice<bf16>,
    /// The ring slots of a step's states gathered from a feature ring, one a token.
    slots: CudaSlice<i32>,
    /// f32 `[tokens, H]`: the staged `pre` of a step fed it.
    pub pre: CudaSlice<f32>,
}

impl StagedFeatures {
    /// Room for `tokens` rows of target states `aux_width` wide (none when 0) and of `pre`
    /// `hidden` wide.
    pub fn new(
        gpu: &Gpu,
        tokens: usize,
        aux_width: usize,
        hidden: usize,
    ) -> Result<StagedFeatures, GpuError> {
        let rows_of_aux = if aux_width > 0 { tokens } else { 0 };
        Ok(StagedFeatures {
            aux: gpu.zeros((rows_of_aux * aux_width).max(1))?,
            slots: gpu.zeros(rows_of_aux.max(1))?,
            pre: gpu.zeros(tokens * hidden)?,
        })
    }

    /// Gathers the rows `ids` of `ring` into the staged target states, on `gpu`'s stream.
    pub fn gather(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        ring: &FeatureRing,
        ids: &[u64],
    ) -> Result<(), GpuForwardError> {
        let stream = gpu.stream();
        ring.gather(kernels, stream, ids, &mut self.slots, &mut self.aux)?;
        Ok(())
    }

    /// Stages `input` into the buffer of its kind: host rows copied, rows of `ring`
    /// gathered on the device.
    pub fn stage(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        input: HeadInput,
        ring: Option<&FeatureRing>,
    ) -> Result<(), GpuForwardError> {
        let stream = gpu.stream();
        match input {
            HeadInput::Aux(features) => {
                let host: Vec<bf16> = features.iter().map(|&v| bf16::from_f32(v)).collect();
                stream.memcpy_htod(&host, &mut self.aux.slice_mut(0..host.len()))?;
            }
            HeadInput::Ring(ids) => {
                let ring = ring.ok_or(GpuForwardError::NoFeatureRing)?;
                self.gather(gpu, kernels, ring, ids)?;
            }
            HeadInput::Pre(features) => {
                let dst = &mut self.pre.slice_mut(0..features.len());
                stream.memcpy_htod(features, dst)?;
            }
        }
        Ok(())
    }
}
