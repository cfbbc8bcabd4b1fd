//! Tensor parallelism's sharding of a Llama-family model, Megatron-style as
//! vLLM shards it: q/k/v and gate/up split by columns of their output (rows of the stored
//! `[out, in]` matrix), o and down by columns of their input, the embedding and the LM
//! head by contiguous vocabulary ranges, the norms replicated. The KV cache follows the
//! KV heads: each rank holds those its query heads read, a KV head replicated on
//! `N / num_kv_heads` ranks when there are fewer KV heads than ranks.
//!
//! This module describes the shards and cuts them; no forward runs on them yet (the
//! NCCL runners are not built), and `--tensor-parallel-size` above 1 is refused.

mod cut;
mod rank;
mod shape;
mod validate;
mod weight;

pub use cut::{cut, Cut};
pub use rank::RankShard;
pub use shape::TpShape;
pub use validate::{validate, TpError};
pub use weight::LlamaWeight;

#[cfg(test)]
mod tests;
