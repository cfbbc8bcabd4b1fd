//! The numbers of a model that its sharding depends on.

use super::TpError;
use crate::config::ModelConfig;

/// The dimensions tensor parallelism splits: attention heads, the MLP's inner width, the
/// vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention: `num_heads` is a multiple of them).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// The residual stream's width.
    pub hidden_size: usize,
    /// The MLP's inner width.
    pub intermediate_size: usize,
    /// Token ids.
    pub vocab_size: usize,
}

impl TpShape {
    /// The shape of `c`; latent attention and mixtures of experts are refused (their
    /// sharding is not described here).
    pub fn of(c: &ModelConfig) -> Result<TpShape, TpError> {
        if c.mla.is_some() {
            return Err(TpError::Unsupported("multi-head latent attention"));
        }
        if c.moe.is_some() {
            return Err(TpError::Unsupported("a mixture of experts"));
        }
        Ok(TpShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            vocab_size: c.vocab_size,
        })
    }

    /// Rows of q in the stacked q/k/v projection (`num_heads * head_dim`).
    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Rows of k (and of v) in the stacked q/k/v projection (`num_kv_heads * head_dim`).
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}
