//! The start-up checks of a tensor-parallel size against a model and the GPUs there are,
//! as vLLM makes them.

use super::TpShape;

/// A tensor-parallel size the model or the machine cannot be split over, with the numbers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TpError {
    #[error("--tensor-parallel-size must be at least 1, not 0")]
    Zero,
    #[error("--tensor-parallel-size {size} does not divide the model's {heads} attention heads")]
    Heads { heads: usize, size: usize },
    #[error("the model's {heads} attention heads are not a multiple of its {kv_heads} KV heads")]
    Grouping { heads: usize, kv_heads: usize },
    #[error("--tensor-parallel-size {size} does not divide the model's {kv_heads} KV heads (with at least as many KV heads as ranks, each rank holds an equal share)")]
    KvHeads { kv_heads: usize, size: usize },
    #[error("--tensor-parallel-size {size} is not a multiple of the model's {kv_heads} KV heads (with fewer KV heads than ranks, each KV head is replicated on an equal number of ranks)")]
    KvReplicas { kv_heads: usize, size: usize },
    #[error("--tensor-parallel-size {size} does not divide the model's intermediate size {intermediate}")]
    Intermediate { intermediate: usize, size: usize },
    #[error("--tensor-parallel-size {size} needs {size} GPUs; {gpus} found")]
    Gpus { size: usize, gpus: usize },
    #[error("rank {rank} is outside a tensor-parallel group of {size}")]
    Rank { rank: usize, size: usize },
    #[error("tensor parallelism does not shard {0} yet")]
    Unsupported(&'static str),
}

/// Checks that `shape` splits over `size` ranks and, where `gpus` is given (the GPUs
/// visible; `None` where no GPU is involved), that there is one GPU per rank. The first
/// failing check is returned, in this order: a zero size, the query heads, the grouping,
/// the KV heads (divided by the size when at least as many, else dividing it), the
/// intermediate size, the GPUs. The vocabulary need not divide (see
/// [`RankShard::vocab`](super::RankShard::vocab)).
pub fn validate(shape: &TpShape, size: usize, gpus: Option<usize>) -> Result<(), TpError> {
    let TpShape {
        num_heads: heads,
        num_kv_heads: kv_heads,
        intermediate_size: intermediate,
        ..
    } = *shape;
    if size == 0 {
        return Err(TpError::Zero);
    }
    if !heads.is_multiple_of(size) {
        return Err(TpError::Heads { heads, size });
    }
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(TpError::Grouping { heads, kv_heads });
    }
    if kv_heads >= size && !kv_heads.is_multiple_of(size) {
        return Err(TpError::KvHeads { kv_heads, size });
    }
    if kv_heads < size && !size.is_multiple_of(kv_heads) {
        return Err(TpError::KvReplicas { kv_heads, size });
    }
    if !intermediate.is_multiple_of(size) {
        return Err(TpError::Intermediate { intermediate, size });
    }
    match gpus {
        Some(gpus) if gpus < size => Err(TpError::Gpus { size, gpus }),
        _ => Ok(()),
    }
}
