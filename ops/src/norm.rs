//! RMSNorm.

use peregrine_kernels::cpu;

/// Root-mean-square normalisation with a learned gain.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    /// A norm over rows of `weight.len()` elements.
    pub fn new(weight: Vec<f32>, eps: f32) -> RmsNorm {
        RmsNorm { weight, eps }
    }

    /// The learned gain, one value per element of a row.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// `out = rms_norm(x)` row by row.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        cpu::rms_norm(x, &self.weight, self.eps, out);
    }

    /// Normalises every `weight.len()`-wide slice of `x` in place (per-head q/k norms).
    pub fn forward_in_place(&self, x: &mut [f32]) {
        let input = x.to_vec();
        cpu::rms_norm(&input, &self.weight, self.eps, x);
    }

    /// `residual += delta; out = rms_norm(residual)`, fused.
    pub fn forward_residual(&self, residual: &mut [f32], delta: &[f32], out: &mut [f32]) {
        cpu::add_rms_norm(residual, delta, &self.weight, self.eps, out);
    }
}
