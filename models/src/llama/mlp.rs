//! The gated MLP of a decoder layer: dense layers' MLP, and each expert of a mixture.

use crate::weights::{WeightError, Weights};
use peregrine_kernels::cpu::{silu_and_mul, Matrix};
use peregrine_ops::Linear;
use std::sync::Arc;

/// A gated MLP: `down(silu(gate(x)) * up(x))`, gate and up stacked into one matrix.
pub(crate) struct GatedMlp {
    pub gate_up: Linear,
    pub down: Linear,
}

impl GatedMlp {
    /// `{prefix}.gate_proj`, `up_proj` and `down_proj` of inner width `inter`.
    pub fn load(
        w: &Weights,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<GatedMlp, WeightError> {
        let matrix = |n: &str, shape| w.matrix(&format!("{prefix}.{n}"), shape);
        let parts = vec![
            matrix("gate_proj.weight", [inter, hidden])?,
            matrix("up_proj.weight", [inter, hidden])?,
        ];
        let gate_up = Matrix::stack(parts).map_err(|source| WeightError::Matrix {
            name: format!("{prefix}.gate_proj.weight"),
            source,
        })?;
        Ok(GatedMlp {
            gate_up: Linear::of(Arc::new(gate_up), None),
            down: Linear::of(Arc::new(matrix("down_proj.weight", [hidden, inter])?), None),
        })
    }

    /// The MLP's inner width.
    pub fn inter(&self) -> usize {
        self.down.in_features()
    }

    /// The MLP of `x`'s rows into `out`, through `gate_up` and `act` (each at least as
    /// many rows as `x`).
    pub fn forward(&self, x: &[f32], gate_up: &mut [f32], act: &mut [f32], out: &mut [f32]) {
        let (k, inter) = (self.gate_up.in_features(), self.inter());
        let rows = x.len() / k;
        let (gate_up, act) = (&mut gate_up[..rows * 2 * inter], &mut act[..rows * inter]);
        self.gate_up.forward(x, gate_up);
        silu_and_mul(gate_up, inter, act);
        self.down.forward(act, out);
    }
}
