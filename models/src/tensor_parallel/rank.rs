//! What one rank of a tensor-parallel group owns: query heads, KV heads, a slice of the
//! MLP's inner width, a vocabulary range.

use super::{validate, TpError, TpShape};
use std::ops::Range;

/// Rank `rank` of `size`'s part of a model of shape `shape`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankShard {
    /// The model's shape.
    pub shape: TpShape,
    /// This rank, from 0.
    pub rank: usize,
    /// The ranks in the group (the tensor-parallel size).
    pub size: usize,
}

impl RankShard {
    /// Rank `rank` of `size` over `shape`, checked by [`validate`] (no GPU count).
    pub fn new(shape: TpShape, rank: usize, size: usize) -> Result<RankShard, TpError> {
        validate(&shape, size, None)?;
        if rank >= size {
            return Err(TpError::Rank { rank, size });
        }
        Ok(RankShard { shape, rank, size })
    }

    /// Every rank of `size` over `shape`, in rank order.
    pub fn all(shape: TpShape, size: usize) -> Result<Vec<RankShard>, TpError> {
        (0..size).map(|r| RankShard::new(shape, r, size)).collect()
    }

    /// The query heads this rank computes: `num_heads / size` consecutive heads.
    pub fn q_heads(&self) -> Range<usize> {
        let per = self.shape.num_heads / self.size;
        self.rank * per..(self.rank + 1) * per
    }

    /// The KV heads this rank holds (in its projections and its KV cache): with at least
    /// as many KV heads as ranks, `num_kv_heads / size` consecutive heads; with fewer, the
    /// one KV head its query heads read, which `size / num_kv_heads` ranks then share.
    pub fn kv_heads(&self) -> Range<usize> {
        let kv = self.shape.num_kv_heads;
        if kv >= self.size {
            let per = kv / self.size;
            self.rank * per..(self.rank + 1) * per
        } else {
            let head = self.rank / (self.size / kv);
            head..head + 1
        }
    }

    /// How many ranks hold each of this rank's KV heads (1 unless replicated).
    pub fn kv_replicas(&self) -> usize {
        (self.size / self.shape.num_kv_heads).max(1)
    }

    /// This rank's columns of the MLP's inner width: `intermediate_size / size`
    /// consecutive ones.
    pub fn inter(&self) -> Range<usize> {
        let per = self.shape.intermediate_size / self.size;
        self.rank * per..(self.rank + 1) * per
    }

    /// Rows of every rank's vocabulary shard: `ceil(vocab_size / size)`. As in vLLM's
    /// `VocabParallelEmbedding`, the vocabulary is padded to `size` times this, the
    /// padding falling on the last ranks; a shard's padded rows are zeros, and the logits
    /// they give are dropped when the ranks' logits are gathered.
    pub fn vocab_rows(&self) -> usize {
        self.shape.vocab_size.div_ceil(self.size)
    }

    /// The token ids this rank's embedding and LM head rows hold, in order (fewer than
    /// [`vocab_rows`](Self::vocab_rows) on a rank that holds padding).
    pub fn vocab(&self) -> Range<usize> {
        let (per, vocab) = (self.vocab_rows(), self.shape.vocab_size);
        (self.rank * per).min(vocab)..((self.rank + 1) * per).min(vocab)
    }
}
