//! The CPU backend: the f32 model and its host KV cache.

use super::{blocks_in, sample_on_host, ModelBackend, PoolInfo, RowSampling};
use crate::messages::GeneratedToken;
use peregrine_models::{LlamaModel, ModelConfig};
use peregrine_ops::{AttentionPlan, KvCache};
use std::sync::Arc;

struct CpuBackend {
    model: LlamaModel,
    cache: KvCache,
    pool: PoolInfo,
    /// Layers whose inputs every forward records (none: no recording).
    hidden_layers: Vec<usize>,
    /// What the last forward recorded.
    hidden: Option<Vec<f32>>,
}

impl CpuBackend {
    /// The forward, recording the hidden states when asked to.
    fn forward(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        if self.hidden_layers.is_empty() {
            return Ok(self
                .model
                .forward(tokens, plan, &mut self.cache, logit_rows)?);
        }
        let (logits, hidden) = self.model.forward_with_aux(
            tokens,
            plan,
            &mut self.cache,
            logit_rows,
            &self.hidden_layers,
        )?;
        self.hidden = Some(hidden);
        Ok(logits)
    }
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
    Ok(Box::new(CpuBackend {
        model,
        cache,
        pool,
        hidden_layers: Vec::new(),
        hidden: None,
    }))
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
        let logits = self.forward(tokens, plan, logit_rows)?;
        let vocab = self.model.config().vocab_size;
        Ok(sample_on_host(&logits, vocab, sampling))
    }

    fn forward_logits(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        self.forward(tokens, plan, logit_rows)
    }

    fn record_hidden(&mut self, layers: &[usize]) -> anyhow::Result<()> {
        let num_layers = self.model.config().num_layers;
        if let Some(l) = layers.iter().find(|&&l| l >= num_layers) {
            anyhow::bail!("hidden states of layer {l} asked of a target of {num_layers} layers");
        }
        self.hidden_layers = layers.to_vec();
        Ok(())
    }

    fn take_hidden(&mut self) -> Option<Vec<f32>> {
        self.hidden.take()
    }

    fn embedding_table(&self) -> Option<Arc<[f32]>> {
        Some(self.model.embedding_table())
    }
}
