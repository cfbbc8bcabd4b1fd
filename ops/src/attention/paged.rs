//! The paged attention op.

use super::{AttentionPlan, PlanError};
use crate::KvCache;
use peregrine_kernels::cpu::{self, AttentionSeq};

/// Grouped-query attention over a paged KV cache.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttention {
    /// Query heads.
    pub num_heads: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl PagedAttention {
    /// Attention for the planned rows of `q` into `o` (both `[rows, heads * head_dim]`),
    /// over layer `layer` of `cache`. The plan is checked against q and o first.
    pub fn forward(
        &self,
        q: &[f32],
        o: &mut [f32],
        cache: &KvCache,
        layer: usize,
        plan: &AttentionPlan,
    ) -> Result<(), PlanError> {
        let width = self.num_heads * cache.layout().head_dim as usize;
        plan.check_fits(q.len() / width, o.len() / width)?;
        let seqs: Vec<AttentionSeq> = plan
            .seqs()
            .iter()
            .map(|s| AttentionSeq {
                q_start: s.q_start,
                q_len: s.q_len,
                context_len: s.context_len,
                block_table: &s.block_table,
            })
            .collect();
        let (k, v) = cache.layer(layer);
        let rows = q.len() / width;
        // The kernel sees exactly as many rows of o as of q, never more.
        cpu::paged_attention(
            q,
            self.num_heads,
            k,
            v,
            cache.layout(),
            &seqs,
            self.scale,
            &mut o[..rows * width],
        );
        Ok(())
    }
}
