//! The CPU backend: the f32 model and its host KV cache, with a scratch block for the
//! padded rows of replayed decode graphs.

mod disk_blocks;
mod host_blocks;
mod memory;

pub use memory::{CpuFootprint, StepBounds};

use super::{
    argmax_rows, blocks_in, sample_on_host, ModelBackend, PoolInfo, RowMasks, RowSampling,
    StepSource,
};
use crate::graphs::{is_decode_step, CaptureSizes, CpuDecodeGraphs};
use crate::kv_disk::{ContentHash, DiskTierStart};
use crate::messages::{GeneratedToken, HiddenData, KvMove, KvSource, LoadDone};
use anyhow::anyhow;
use disk_blocks::CpuDiskBlocks;
use host_blocks::HostBlocks;
use peregrine_kernels::cpu::Matrix;
use peregrine_models::{LlamaModel, ModelConfig};
use peregrine_ops::{AttentionPlan, KvCache, KvDtype, KvRows, Linear};
use std::path::Path;
use std::sync::Arc;

struct CpuBackend {
    model: LlamaModel,
    cache: KvCache,
    pool: PoolInfo,
    /// Layers whose inputs every forward records (none: no recording).
    hidden_layers: Vec<usize>,
    /// What the last forward recorded.
    hidden: Option<HiddenData>,
    /// The captured decode graphs, if any.
    graphs: Option<CpuDecodeGraphs>,
    /// The step [`ModelBackend::greedy`] ran ahead (on the CPU, at once): its logits, whose
    /// argmax is taken under the masks of the call that reads it, and what it recorded.
    queued: Option<(Vec<f32>, Option<HiddenData>)>,
    /// The host tier below the pool, if one is kept.
    host: Option<HostBlocks>,
    /// The disk tier below both, if one is kept.
    disk: Option<CpuDiskBlocks>,
    /// Pool blocks loaded from the host tier since [`ModelBackend::finish_loads`] last
    /// reported (made in `move_kv`, at once).
    loaded: Vec<u32>,
    /// What it held at start-up, until the engine takes it.
    disk_start: Option<DiskTierStart>,
}

impl CpuBackend {
    /// The forward, replayed through a graph when one serves the step, recording the
    /// hidden states when asked to; it drops any step run ahead.
    fn forward(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        self.queued = None;
        let vocab = self.model.config().vocab_size;
        if let Some(graphs) = &mut self.graphs {
            if let Some(out) = graphs.replay(tokens, plan, logit_rows, &mut self.cache, vocab)? {
                self.hidden = out.hidden.map(HiddenData::Host);
                return Ok(out.logits);
            }
        }
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
        self.hidden = Some(HiddenData::Host(hidden));
        Ok(logits)
    }
}

/// The CPU model with a pool of `kv_cache_memory` bytes in blocks of `block_size` tokens
/// (float32 elements), plus one scratch block, audited before it is allocated.
pub fn cpu_backend(
    model: LlamaModel,
    kv_cache_memory: u64,
    block_size: usize,
) -> anyhow::Result<Box<dyn ModelBackend>> {
    cpu_backend_with(model, kv_cache_memory, block_size, KvDtype::Float32)
}

/// [`cpu_backend`] whose cache stores `dtype` elements.
pub fn cpu_backend_with(
    model: LlamaModel,
    kv_cache_memory: u64,
    block_size: usize,
    dtype: KvDtype,
) -> anyhow::Result<Box<dyn ModelBackend>> {
    let block_bytes = model.config().kv_bytes_per_token(dtype.bytes()) * block_size as u64;
    let num_blocks = blocks_in(kv_cache_memory, block_bytes, block_size, "kv_cache_memory")?;
    let scratch_block = num_blocks;
    let with_scratch = num_blocks
        .checked_add(1)
        .ok_or_else(|| anyhow::anyhow!("kv_cache_memory makes more blocks than u32 names"))?;
    let layout = model.kv_layout(with_scratch as u64, block_size as u64);
    let audit = layout
        .audit(dtype.bytes())
        .map_err(|e| anyhow::anyhow!("address audit: {e}"))?;
    let rows = model.kv_rows();
    let cache =
        KvCache::try_with_dtype(model.config().num_layers, layout, rows, dtype).map_err(|e| {
            anyhow::anyhow!(
                "allocating the KV cache (kv_cache_memory {kv_cache_memory} bytes): {e:#}"
            )
        })?;
    let pool = PoolInfo {
        layout,
        bytes_per_layer: cache.bytes_per_layer(),
        audit,
        kernels: match rows {
            KvRows::KeysAndValues => "write_kv, paged_attention",
            KvRows::Latent => "write_latent, mla_attention",
        },
        computed_in: "u64",
        device: "cpu".into(),
        scratch_block: Some(scratch_block),
    };
    Ok(Box::new(CpuBackend {
        model,
        cache,
        pool,
        hidden_layers: Vec::new(),
        hidden: None,
        graphs: None,
        queued: None,
        host: None,
        disk: None,
        loaded: Vec::new(),
        disk_start: None,
    }))
}

impl ModelBackend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn pool(&self) -> &PoolInfo {
        &self.pool
    }

    fn record_hidden(&mut self, layers: &[usize]) -> anyhow::Result<()> {
        self.queued = None;
        let num_layers = self.model.config().num_layers;
        // Layer `num_layers`'s "input" is the last layer's output (what MTP reads).
        if let Some(l) = layers.iter().find(|&&l| l > num_layers) {
            anyhow::bail!("hidden states of layer {l} asked of a target of {num_layers} layers");
        }
        self.hidden_layers = layers.to_vec();
        // Graphs captured before record the old layers: capture them again.
        let sizes = self.graphs.as_ref().map(|g| g.sizes().clone());
        match sizes {
            Some(sizes) => self.capture_graphs(Some(&sizes)),
            None => Ok(()),
        }
    }

    fn keep_host_tier(&mut self, bytes: u64) -> anyhow::Result<u32> {
        let host = HostBlocks::for_cache(&self.cache, bytes)?;
        let slots = host.slots();
        self.host = Some(host);
        Ok(slots)
    }

    fn host_tier_slots(&self) -> u32 {
        self.host.as_ref().map_or(0, HostBlocks::slots)
    }

    fn keep_disk_tier(
        &mut self,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<()> {
        let (disk, start) = CpuDiskBlocks::open(&self.cache, dir, bytes, model)?;
        self.disk_start = Some(start);
        self.disk = Some(disk);
        Ok(())
    }

    fn take_disk_tier(&mut self) -> Option<DiskTierStart> {
        self.disk_start.take()
    }

    fn move_kv(&mut self, moves: &[KvMove]) -> anyhow::Result<()> {
        if moves.is_empty() {
            return Ok(());
        }
        self.queued = None;
        let no_host = || anyhow!("host-tier moves for a CPU backend that keeps no host tier");
        let no_disk = || anyhow!("disk-tier moves for a CPU backend that keeps no disk tier");
        for m in moves {
            match m {
                KvMove::Spill { block, slot } => {
                    self.host
                        .as_mut()
                        .ok_or_else(no_host)?
                        .spill(&self.cache, *block, *slot)?
                }
                KvMove::Load { slot, block } => {
                    self.host
                        .as_ref()
                        .ok_or_else(no_host)?
                        .load(&mut self.cache, *slot, *block)?;
                    self.loaded.push(*block);
                }
                KvMove::DiskWrite {
                    from,
                    slot,
                    parent,
                    tokens,
                } => {
                    let disk = self.disk.as_ref().ok_or_else(no_disk)?;
                    match *from {
                        KvSource::Pool(block) => {
                            disk.write_from_pool(&self.cache, block, *slot, parent, tokens)?
                        }
                        KvSource::Host(h) => {
                            let bytes = self.host.as_ref().ok_or_else(no_host)?.bytes(h)?;
                            disk.write(*slot, parent, tokens, bytes)
                        }
                    }
                }
                KvMove::DiskRead { slot, chain, block } => {
                    let disk = self.disk.as_mut().ok_or_else(no_disk)?;
                    disk.read(*slot, chain, *block);
                }
            }
        }
        Ok(())
    }

    fn finish_loads(&mut self, wait: bool) -> anyhow::Result<Vec<LoadDone>> {
        let mut done: Vec<LoadDone> = self
            .loaded
            .drain(..)
            .map(|block| LoadDone { block, ok: true })
            .collect();
        // The blocks read belong to sequences held out of every step until now, so a step
        // queued ahead, which read none of them, stands.
        if let Some(disk) = &mut self.disk {
            done.extend(disk.finish_reads(&mut self.cache, wait && done.is_empty()));
        }
        Ok(done)
    }

    fn embedding_table(&self) -> Option<Arc<Matrix>> {
        Some(self.model.embedding_table())
    }

    fn lm_head(&self) -> Option<Arc<Linear>> {
        Some(self.model.lm_head())
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.queued = None;
        let Some(sizes) = sizes else {
            self.graphs = None;
            return Ok(());
        };
        let scratch_slot = self.pool.scratch_slot().unwrap_or_default();
        let max_blocks = self
            .pool
            .graph_table_width(self.model.config().max_model_len);
        let graphs = CpuDecodeGraphs::capture(
            &self.model,
            sizes,
            max_blocks,
            scratch_slot,
            &self.hidden_layers,
        )?;
        self.graphs = Some(graphs);
        Ok(())
    }

    fn sampled(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        sampling: &mut [RowSampling],
        masks: RowMasks,
    ) -> anyhow::Result<Vec<GeneratedToken>> {
        let logits = self.forward(tokens, plan, logit_rows)?;
        let vocab = self.model.config().vocab_size;
        let masks = masks.wait(sampling.len())?;
        Ok(sample_on_host(&logits, vocab, sampling, &masks))
    }

    fn logits(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        self.forward(tokens, plan, logit_rows)
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    /// The CPU runs `next` at once, after this step: its keys and values are written
    /// before any later step, as a device queue would order them.
    fn greedy(
        &mut self,
        source: StepSource,
        next: Option<&AttentionPlan>,
        masks: RowMasks,
    ) -> anyhow::Result<(Vec<u32>, bool)> {
        let (logits, decode) = match source {
            StepSource::Fresh {
                tokens,
                plan,
                logit_rows,
            } => (
                self.forward(tokens, plan, logit_rows)?,
                is_decode_step(tokens, plan, logit_rows),
            ),
            StepSource::Queued => match self.queued.take() {
                Some((logits, hidden)) => {
                    self.hidden = hidden;
                    (logits, true)
                }
                None => anyhow::bail!("no step was queued ahead"),
            },
        };
        let vocab = self.model.config().vocab_size;
        let rows = logits.len() / vocab.max(1);
        let ids = argmax_rows(&logits, vocab, &masks.wait(rows)?)?;
        let Some(next) = next.filter(|_| decode) else {
            return Ok((ids, false));
        };
        // As the GPU's decode graphs do: `next` goes on from this step's rows, one each.
        if next.seqs().len() != ids.len() {
            anyhow::bail!(
                "a step queued ahead of {} sequences after one of {}",
                next.seqs().len(),
                ids.len()
            );
        }
        let rows: Vec<usize> = (0..ids.len()).collect();
        let recorded = self.hidden.take();
        let logits = self.forward(&ids, next, &rows)?;
        self.queued = Some((logits, self.hidden.take()));
        self.hidden = recorded;
        Ok((ids, true))
    }

    fn take_hidden(&mut self) -> Option<HiddenData> {
        self.hidden.take()
    }
}
