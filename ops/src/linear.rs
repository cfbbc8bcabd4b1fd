//! A linear layer with an optional bias.

use peregrine_kernels::cpu;
use std::sync::Arc;

/// `y = x · Wᵀ + b` with `W` stored `[out_features, in_features]` in float32. The weight
/// is shared, so tied embeddings are held once.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Arc<[f32]>,
    bias: Option<Vec<f32>>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// A layer from a row-major `[out_features, in_features]` weight and optional bias.
    pub fn new(weight: Arc<[f32]>, bias: Option<Vec<f32>>, out_features: usize) -> Linear {
        assert!(
            out_features > 0 && weight.len().is_multiple_of(out_features),
            "Linear: weight shape"
        );
        if let Some(b) = &bias {
            assert_eq!(b.len(), out_features, "Linear: bias length");
        }
        let in_features = weight.len() / out_features;
        Linear {
            weight,
            bias,
            in_features,
            out_features,
        }
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// The shared weight.
    pub fn weight(&self) -> Arc<[f32]> {
        self.weight.clone()
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Bytes of parameters.
    pub fn size_bytes(&self) -> u64 {
        4 * (self.weight.len() + self.bias.as_ref().map_or(0, Vec::len)) as u64
    }

    /// Applies the layer to every row of `x` (`[rows, in_features]`) into `out`
    /// (`[rows, out_features]`).
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        cpu::linear(x, self.in_features, &self.weight, self.out_features, out);
        if let Some(b) = &self.bias {
            for row in out.chunks_mut(self.out_features) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
    }
}
