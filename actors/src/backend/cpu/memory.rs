//! The host memory a CPU engine takes at a configuration's limits, planned from the model's
//! shape before anything is allocated: the KV cache, the buffers of the largest eager step,
//! and the buffers the decode graphs share. Start-up and every reload check the plan
//! against what the host has ([`peregrine_runtime::host_memory`]); a plan that does not
//! fit is a refused configuration naming the setting, not an abort or an out-of-memory
//! kill later.

use crate::backend::blocks_in;
use crate::graphs::CaptureSizes;
use peregrine_models::{LlamaBuffers, ModelConfig, StepShape};
use peregrine_ops::KvDtype;
use peregrine_runtime::host_memory::{human_bytes, MemoryNeed};

/// The limits of a step that size its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBounds {
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: usize,
    /// `max_num_seqs`.
    pub max_num_seqs: usize,
    /// Draft tokens verified per sequence and step (0 without speculation).
    pub drafts: usize,
}

/// A CPU model's shape as the plan needs it.
#[derive(Clone, Debug)]
pub struct CpuFootprint {
    config: ModelConfig,
    kv_bytes_per_token: u64,
    block_size: usize,
    max_model_len: usize,
    /// Layers whose inputs each step records (for an EAGLE-3 head).
    aux_layers: usize,
}

impl CpuFootprint {
    /// The footprint of a model of `config` (its KV cache of `kv_dtype` elements), served
    /// with blocks of `block_size` tokens, sequences of up to `max_model_len` and
    /// `aux_layers` recorded layers.
    pub fn new(
        config: &ModelConfig,
        kv_dtype: KvDtype,
        block_size: usize,
        max_model_len: usize,
        aux_layers: usize,
    ) -> CpuFootprint {
        CpuFootprint {
            config: config.clone(),
            kv_bytes_per_token: config.kv_bytes_per_token(kv_dtype.bytes()),
            block_size: block_size.max(1),
            max_model_len: max_model_len.max(1),
            aux_layers,
        }
    }

    /// The KV cache's size when `kv_cache_memory` is not set: room for one sequence of
    /// `max_model_len` tokens or for four steps of `max_num_batched_tokens` if that is
    /// more, but no more than `max_num_seqs` sequences of `max_model_len` can hold (a token
    /// budget, as llama.cpp's context is one), in whole blocks; at most a quarter of
    /// `available` bytes (what the host can give, where known), and at least one block.
    pub fn default_kv_cache_memory(&self, bounds: StepBounds, available: Option<u64>) -> u64 {
        let block_bytes = self.kv_bytes_per_token * self.block_size as u64;
        let tokens = self
            .max_model_len
            .max(bounds.max_num_batched_tokens.saturating_mul(4))
            .min(bounds.max_num_seqs.saturating_mul(self.max_model_len));
        let wanted = (tokens.div_ceil(self.block_size) as u64).saturating_mul(block_bytes);
        let cap = available.map_or(u64::MAX, |bytes| bytes / 4 / block_bytes * block_bytes);
        wanted.min(cap).max(block_bytes)
    }

    /// The KV cache of `kv_cache_memory` bytes: its blocks and the scratch block.
    pub fn kv_cache(&self, kv_cache_memory: u64) -> anyhow::Result<MemoryNeed> {
        let block_bytes = self.kv_bytes_per_token * self.block_size as u64;
        let blocks = blocks_in(
            kv_cache_memory,
            block_bytes,
            self.block_size,
            "kv_cache_memory",
        )?;
        Ok(MemoryNeed {
            what: format!("kv_cache_memory {}", human_bytes(kv_cache_memory)),
            bytes: (u64::from(blocks) + 1).saturating_mul(block_bytes),
        })
    }

    /// The buffers of the largest eager step `bounds` allow: `max_num_batched_tokens`
    /// rows (no more than `max_num_seqs` sequences of `max_model_len` hold).
    pub fn eager_step(&self, bounds: StepBounds) -> MemoryNeed {
        let rows = bounds
            .max_num_batched_tokens
            .min(bounds.max_num_seqs.saturating_mul(self.max_model_len))
            .max(1);
        let seqs = bounds.max_num_seqs.min(rows).max(1);
        let shape = StepShape {
            rows,
            seqs,
            logit_rows: seqs.saturating_mul(1 + bounds.drafts).min(rows),
        };
        MemoryNeed {
            what: format!(
                "max_num_batched_tokens {} (the buffers of the largest step)",
                bounds.max_num_batched_tokens
            ),
            bytes: self.buffers(shape),
        }
    }

    /// The buffers the decode graphs of `sizes` share (sized for the largest), named by
    /// the setting `field` that chose the sizes.
    pub fn graphs(&self, sizes: &CaptureSizes, field: &str) -> MemoryNeed {
        MemoryNeed {
            what: format!(
                "{field} (decode graphs for batches of up to {} sequences)",
                sizes.largest()
            ),
            bytes: self.buffers(StepShape::decode(sizes.largest())),
        }
    }

    /// The bytes of a forward's buffers at `shape`.
    fn buffers(&self, shape: StepShape) -> u64 {
        let max_blocks = self.max_model_len.div_ceil(self.block_size);
        LlamaBuffers::bytes(&self.config, shape, max_blocks, self.aux_layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_runtime::host_memory::check_fits;

    fn footprint() -> CpuFootprint {
        let config = ModelConfig::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":16,
            "intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":2,
            "max_position_embeddings":256}"#,
        )
        .unwrap();
        CpuFootprint::new(&config, KvDtype::Float32, 16, 256, 0)
    }

    #[test]
    fn the_default_kv_cache_holds_one_long_sequence_or_four_steps_within_a_quarter_of_memory() {
        let f = footprint(); // blocks of 16 tokens, max_model_len 256
        let block = f.kv_bytes_per_token * 16;
        let bounds = |max_num_batched_tokens, max_num_seqs| StepBounds {
            max_num_batched_tokens,
            max_num_seqs,
            drafts: 0,
        };
        // One sequence of max_model_len: 256 tokens, 16 blocks.
        assert_eq!(f.default_kv_cache_memory(bounds(32, 8), None), 16 * block);
        // Four steps of 100 tokens: 400 tokens, 25 blocks.
        assert_eq!(f.default_kv_cache_memory(bounds(100, 8), None), 25 * block);
        // No more than the sequences can hold: 2 of 256 tokens.
        assert_eq!(f.default_kv_cache_memory(bounds(1000, 2), None), 32 * block);
        // A quarter of what the host has, in whole blocks, but never less than a block.
        let available = 40 * block + 7;
        assert_eq!(
            f.default_kv_cache_memory(bounds(32, 8), Some(available)),
            10 * block
        );
        assert_eq!(f.default_kv_cache_memory(bounds(32, 8), Some(block)), block);
    }

    #[test]
    fn the_plan_grows_with_each_limit_and_names_it() {
        let f = footprint();
        let bounds = StepBounds {
            max_num_batched_tokens: 64,
            max_num_seqs: 8,
            drafts: 0,
        };
        let small = f.eager_step(bounds);
        let large = f.eager_step(StepBounds {
            max_num_batched_tokens: 1_000_000_000,
            max_num_seqs: 1_000_000_000,
            ..bounds
        });
        assert!(large.bytes > 1000 * small.bytes, "{small:?} {large:?}");
        assert!(large.what.starts_with("max_num_batched_tokens 1000000000"));
        let err = check_fits(&[large], Some(24 << 30))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("needs") && err.contains("24.0 GiB is available"),
            "{err}"
        );

        // Rows beyond what max_num_seqs sequences of max_model_len hold are never planned.
        let capped = f.eager_step(StepBounds {
            max_num_batched_tokens: 1_000_000,
            max_num_seqs: 1,
            drafts: 0,
        });
        let whole = f.eager_step(StepBounds {
            max_num_batched_tokens: 256,
            max_num_seqs: 1,
            drafts: 0,
        });
        assert_eq!(capped.bytes, whole.bytes);

        let kv = f.kv_cache(1 << 40).unwrap();
        assert!(
            kv.bytes >= 1 << 40 && kv.what == "kv_cache_memory 1.00 TiB",
            "{kv:?}"
        );
        let graphs = f.graphs(&CaptureSizes::for_max_num_seqs(64), "max_num_seqs");
        assert!(graphs.what.contains("up to 64 sequences"), "{graphs:?}");
        assert!(graphs.bytes > 0);
    }
}
