//! A linear layer with an optional bias.

use peregrine_kernels::cpu::Matrix;
use std::sync::Arc;

/// `y = x · Wᵀ + b` with `W` a `[out_features, in_features]` [`Matrix`] kept in the form it
/// was stored in (float32, bf16, f16 or block-quantized). The weight is shared, so tied
/// embeddings are held once.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Arc<Matrix>,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// A layer from a row-major float32 `[out_features, in_features]` weight and optional
    /// bias.
    pub fn new(weight: Arc<[f32]>, bias: Option<Vec<f32>>, out_features: usize) -> Linear {
        assert!(
            out_features > 0 && weight.len().is_multiple_of(out_features),
            "Linear: weight shape"
        );
        let cols = weight.len() / out_features;
        let matrix = Matrix::f32(weight, cols).expect("Linear: weight shape checked above");
        Linear::of(Arc::new(matrix), bias)
    }

    /// A layer over a shared weight matrix of any storage, with an optional bias.
    pub fn of(weight: Arc<Matrix>, bias: Option<Vec<f32>>) -> Linear {
        if let Some(b) = &bias {
            assert_eq!(b.len(), weight.rows(), "Linear: bias length");
        }
        Linear { weight, bias }
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.cols()
    }

    /// The shared weight matrix.
    pub fn matrix(&self) -> &Arc<Matrix> {
        &self.weight
    }

    /// The weight as float32 `[out_features, in_features]` (shared when stored so, else
    /// dequantized).
    pub fn weight(&self) -> Arc<[f32]> {
        match self.weight.as_f32() {
            Some(w) => w.clone(),
            None => self.weight.to_f32().into(),
        }
    }

    /// The layer with its weight quantized to Q8_0 blocks where it is float32 with rows of
    /// whole blocks ([`Matrix::to_q8_0`]); as it is otherwise. The bias stays float32.
    pub fn to_q8_0(&self) -> Linear {
        match self.weight.to_q8_0() {
            Some(w) => Linear::of(Arc::new(w), self.bias.clone()),
            None => self.clone(),
        }
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight.rows()
    }

    /// Bytes of parameters.
    pub fn size_bytes(&self) -> u64 {
        self.weight.size_bytes() + 4 * self.bias.as_ref().map_or(0, Vec::len) as u64
    }

    /// Applies the layer to every row of `x` (`[rows, in_features]`) into `out`
    /// (`[rows, out_features]`).
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        self.weight.matmul(x, out);
        if let Some(b) = &self.bias {
            for row in out.chunks_mut(self.out_features()) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
    }
}
