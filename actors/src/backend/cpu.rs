//! The CPU backend: the f32 model and its host KV cache.

use super::{blocks_in, sample_on_host, ModelBackend, PoolInfo, RowSampling};
use crate::messages::GeneratedToken;
use peregrine_models::{LlamaModel, ModelConfig};
use peregrine_ops::{AttentionPlan, KvCache};

struct CpuBackend {
    model: LlamaModel,
    cache: KvCache,
    pool: PoolInfo,
}

/// The CPU model with a pool of `kv_cache_memory` bytes in blocks of `block_size` tokens,
/// audited before it is allocated.
pub fn cpu_backend(
    model: LlamaModel,
    kv_cache_memory: u64,
    block_size: usize,
) -> anyhow::Result<Box<dyn ModelBackend>> {
    let block_bytes = model.kv_bytes_per_token() * block_size as u64;
    let num_blocks = blocks_in(kv_cache_memory, block_bytes, block_size, "kv_cache_memory")?;
    let layout = model.kv_layout(num_blocks as u64, block_size as u64);
    let audit = layout
        .audit(4)
        .map_err(|e| anyhow::anyhow!("address audit: {e}"))?;
    let cache = KvCache::new(model.config().num_layers, layout);
    let pool = PoolInfo {
        layout,
        bytes_per_layer: cache.bytes_per_layer(),
        audit,
        kernels: "write_kv, paged_attention",
        computed_in: "u64",
        device: "cpu".into(),
    };
    Ok(Box::new(CpuBackend { model, cache, pool }))
}

impl ModelBackend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn pool(&self) -> &PoolInfo {
        &self.pool
    }

    fn step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        sampling: &mut [RowSampling],
    ) -> anyhow::Result<Vec<GeneratedToken>> {
        let logits = self
            .model
            .forward(tokens, plan, &mut self.cache, logit_rows)?;
        let vocab = self.model.config().vocab_size;
        Ok(sample_on_host(&logits, vocab, sampling))
    }

    fn forward_logits(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        Ok(self
            .model
            .forward(tokens, plan, &mut self.cache, logit_rows)?)
    }
}
