//! The paged attention op: from a host plan, or from the staged metadata buffers a
//! captured graph reads at replay. Either way the planned rows are checked against q and o
//! on the host before the kernel runs.

use super::{AttentionPlan, PlanError};
use crate::kv_cache::KvLayer;
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

/// A step's attention metadata as staged buffers hold it, for `seqs` sequences. A padded
/// sequence repeats the last real one's entries: its query start equals the next one's, so
/// it has no query rows and the kernel leaves its rows of o untouched.
#[derive(Clone, Copy, Debug)]
pub struct StagedMeta<'a> {
    /// `[seqs + 1]`: each sequence's first query row, then the planned row count.
    pub query_start: &'a [u32],
    /// `[seqs]`: tokens in each sequence's cache after this step's writes.
    pub seq_lens: &'a [u32],
    /// `[seqs, max_blocks]`: each sequence's block ids.
    pub block_tables: &'a [u32],
    /// Entries of one block table.
    pub max_blocks: usize,
}

impl StagedMeta<'_> {
    /// The sequences with query rows, refused when the metadata is not a plan (starts that
    /// go backwards, more queries than context, a context past its block table).
    pub(super) fn seqs(&self, block_size: usize) -> Result<Vec<AttentionSeq<'_>>, PlanError> {
        let bad = |seq, reason: String| PlanError::Metadata { seq, reason };
        let mut seqs = Vec::new();
        for (s, (bounds, &len)) in self.query_start.windows(2).zip(self.seq_lens).enumerate() {
            let (start, end, len) = (bounds[0] as usize, bounds[1] as usize, len as usize);
            if end < start {
                return Err(bad(s, format!("query rows {start}..{end} go backwards")));
            }
            if end == start {
                continue;
            }
            if end - start > len {
                return Err(bad(s, format!("{} queries over {len} tokens", end - start)));
            }
            if len.div_ceil(block_size) > self.max_blocks {
                return Err(bad(
                    s,
                    format!("{len} tokens past a table of {} blocks", self.max_blocks),
                ));
            }
            seqs.push(AttentionSeq {
                q_start: start,
                q_len: end - start,
                context_len: len,
                block_table: &self.block_tables[s * self.max_blocks..(s + 1) * self.max_blocks],
            });
        }
        Ok(seqs)
    }
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
        self.run(q, o, cache, layer, plan.rows(), &seqs)
    }

    /// [`PagedAttention::forward`] over the metadata staged buffers hold (what a captured
    /// graph's attention reads at every replay): the planned row count is the last query
    /// start, checked against q and o before the kernel runs.
    pub fn forward_staged(
        &self,
        q: &[f32],
        o: &mut [f32],
        cache: &KvCache,
        layer: usize,
        meta: &StagedMeta,
    ) -> Result<(), PlanError> {
        let planned = meta.query_start.last().map_or(0, |&r| r as usize);
        let seqs = meta.seqs(cache.layout().block_size as usize)?;
        self.run(q, o, cache, layer, planned, &seqs)
    }

    /// Checks `planned` rows against q and o, then runs the kernel over `seqs`.
    fn run(
        &self,
        q: &[f32],
        o: &mut [f32],
        cache: &KvCache,
        layer: usize,
        planned: usize,
        seqs: &[AttentionSeq],
    ) -> Result<(), PlanError> {
        let width = self.num_heads * cache.layout().head_dim as usize;
        let (q_rows, o_rows) = (q.len() / width, o.len() / width);
        AttentionPlan::check_rows(planned, q_rows, o_rows)?;
        // The kernel sees exactly as many rows of o as of q, never more.
        let o = &mut o[..q_rows * width];
        let (heads, layout, scale) = (self.num_heads, cache.layout(), self.scale);
        match cache.layer_of(layer) {
            KvLayer::Float32(k, v) => cpu::paged_attention(q, heads, k, v, layout, seqs, scale, o),
            KvLayer::Bfloat16(k, v) => cpu::paged_attention(q, heads, k, v, layout, seqs, scale, o),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_kernels::cpu::KvLayout;

    #[test]
    fn staged_metadata_is_checked_against_q_and_o_before_the_kernel() {
        let layout = KvLayout {
            num_blocks: 4,
            block_size: 4,
            num_kv_heads: 1,
            head_dim: 2,
        };
        let cache = KvCache::new(1, layout);
        let op = PagedAttention {
            num_heads: 1,
            scale: 1.0,
        };
        let (q, mut o) = (vec![0.5; 2 * 2], vec![-7.0; 2 * 2]);
        // Three rows planned (the third sequence's) over q and o of two rows.
        let meta = StagedMeta {
            query_start: &[0, 1, 3],
            seq_lens: &[1, 2],
            block_tables: &[0, 1],
            max_blocks: 1,
        };
        let err = op.forward_staged(&q, &mut o, &cache, 0, &meta).unwrap_err();
        assert_eq!(
            err.to_string(),
            "attention plan covers 3 rows but q has only 2"
        );
        assert!(o.iter().all(|&x| x == -7.0));
        // A padded sequence (no query rows) leaves its row of o alone.
        let meta = StagedMeta {
            query_start: &[0, 1, 1],
            ..meta
        };
        op.forward_staged(&q, &mut o, &cache, 0, &meta).unwrap();
        assert!(o[..2].iter().all(|&x| x == 0.0));
        assert_eq!(o[2..], [-7.0, -7.0]);
        let backwards = StagedMeta {
            query_start: &[1, 0, 1],
            ..meta
        };
        let err = op.forward_staged(&q, &mut o, &cache, 0, &backwards);
        assert!(matches!(err, Err(PlanError::Metadata { seq: 0, .. })));
    }
}
