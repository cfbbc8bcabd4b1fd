//! The latent attention op (DeepSeek's MLA, absorbed): from the staged metadata a graph
//! reads at replay, its planned rows checked against q and o on the host before the kernel
//! runs.

use super::{AttentionPlan, PlanError, StagedMeta};
use crate::KvCache;
use peregrine_kernels::cpu;

/// Multi-head latent attention over a paged latent cache: each head's query is its
/// absorbed query over the latent then its rotary query (`[heads, latent + rope]` a row),
/// its output the attention-weighted sum of latents (`[heads, latent]` a row).
#[derive(Clone, Copy, Debug)]
pub struct MlaAttention {
    /// Query heads.
    pub num_heads: usize,
    /// Width of the latent part of a cache row (`kv_lora_rank`).
    pub latent: usize,
    /// Softmax scale.
    pub scale: f32,
}

impl MlaAttention {
    /// Attention of the rows `meta` plans over layer `layer` of `cache` (a latent cache),
    /// `q` into `o`: the planned row count (the last query start) is checked against q
    /// and o before the kernel runs.
    pub fn forward_staged(
        &self,
        q: &[f32],
        o: &mut [f32],
        cache: &KvCache,
        layer: usize,
        meta: &StagedMeta,
    ) -> Result<(), PlanError> {
        let layout = cache.layout();
        let width = self.num_heads * layout.head_dim as usize;
        let out_width = self.num_heads * self.latent;
        let (q_rows, o_rows) = (q.len() / width, o.len() / out_width);
        let planned = meta.query_start.last().map_or(0, |&r| r as usize);
        AttentionPlan::check_rows(planned, q_rows, o_rows)?;
        let seqs = meta.seqs(layout.block_size as usize)?;
        let (latent, _) = cache.layer(layer);
        // The kernel sees exactly as many rows of o as of q, never more.
        cpu::mla_attention(
            &q[..q_rows * width],
            self.num_heads,
            latent,
            layout,
            self.latent,
            &seqs,
            self.scale,
            &mut o[..q_rows * out_width],
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvRows;
    use peregrine_kernels::cpu::KvLayout;

    #[test]
    fn planned_rows_past_q_or_o_are_refused_before_the_kernel() {
        let layout = KvLayout {
            num_blocks: 4,
            block_size: 4,
            num_kv_heads: 1,
            head_dim: 6,
        };
        let cache = KvCache::try_with(1, layout, KvRows::Latent).unwrap();
        let op = MlaAttention {
            num_heads: 2,
            latent: 4,
            scale: 1.0,
        };
        // q of three rows, o of two: a plan of three rows would write past o.
        let (q, mut o) = (vec![0.5; 3 * 2 * 6], vec![-7.0; 2 * 2 * 4]);
        let meta = StagedMeta {
            query_start: &[0, 1, 3],
            seq_lens: &[1, 2],
            block_tables: &[0, 1],
            max_blocks: 1,
        };
        let err = op.forward_staged(&q, &mut o, &cache, 0, &meta).unwrap_err();
        assert!(matches!(err, PlanError::RowsExceedBuffer { .. }), "{err}");
        assert!(o.iter().all(|&x| x == -7.0));
        // Two rows fit; a padded sequence (no query rows) leaves its row of o alone.
        let meta = StagedMeta {
            query_start: &[0, 1, 1],
            ..meta
        };
        op.forward_staged(&q[..2 * 12], &mut o, &cache, 0, &meta)
            .unwrap();
        assert!(o[..8].iter().all(|&x| x == 0.0));
        assert!(o[8..].iter().all(|&x| x == -7.0));
    }
}
