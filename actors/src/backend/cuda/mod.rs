//! The CUDA backend: the bf16 model on device 0 and its KV pool (loaded and sized in
//! `load.rs`), its steps eager or through graphs, and the tiers below its pool
//! (`tiers.rs`: host memory in `host_blocks.rs`, disk in `disk_blocks.rs`, both loaded
//! into the pool on a stream of their own by `load_lane.rs`). A
//! draft model or head beside it keeps its KV in the same blocks (a pool of its own
//! shape). The target records the inputs of the head's aux layers when asked, and with a
//! head beside it stores them into the feature ring the head gathers them from on the
//! device (without one they are downloaded).

mod disk_blocks;
mod host_blocks;
mod load;
mod load_lane;
mod staging;
mod tiers;

pub use load::{cuda_backend, GpuSettings, MAX_SEQ_LEN_TO_CAPTURE};

use super::{
    greedy_verdicts, sample_on_host, ModelBackend, PoolInfo, RowMasks, RowSampling, StepCapacity,
    StepSource,
};
use crate::graphs::{is_decode_step, CaptureSizes, GraphCaptureManager};
use crate::kv_disk::{ContentHash, DiskTierStart};
use crate::messages::{GeneratedToken, HiddenData, KvMove, LoadDone};
use anyhow::Context;
use peregrine_kernels::cuda::attention::audit;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_models::draft_head::cuda::hand_off::DraftHandOff;
use peregrine_models::draft_head::HandedDraft;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::graph::cuda::{GraphLimits, SharedKvCache};
use peregrine_models::llama::cuda::{
    AuxHandOff, CapturedDecode, GpuForwardError, GpuLlama, GreedyInput, QueuedStep, ReplayedStep,
    StepMasks,
};
use peregrine_models::ModelConfig;
use peregrine_ops::cuda::sampler::{GpuSampler, SampleRequest};
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::cudarc::driver::CudaView;
use peregrine_runtime::cuda::Gpu;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tiers::GpuTiers;

struct GpuBackend {
    /// The decode graphs (none until captured, or with --enforce-eager).
    graphs: Option<GraphCaptureManager<CapturedDecode>>,
    /// The verification graphs, by rows (captured with the decode graphs when the target
    /// verifies drafts).
    verify_graphs: Option<GraphCaptureManager<CapturedDecode>>,
    /// The most rows a sequence verifies: 1 + `num_speculative_tokens` (1: no
    /// verification graphs).
    verify_rows: usize,
    model: GpuLlama,
    kernels: Arc<CudaKernels>,
    capacity: StepCapacity,
    /// Shared with the graphs, which write it too.
    cache: SharedKvCache,
    pool: PoolInfo,
    max_seq_len_to_capture: usize,
    /// What the last forward recorded of the layers `ModelBackend::record_hidden` named.
    hidden: Option<HiddenData>,
    /// The ring the recorded layer inputs are handed off in, on the device, to an EAGLE-3
    /// head beside the target; without one they come to the host.
    ring: Option<Arc<FeatureRing>>,
    /// Where a draft head beside the target leaves its chained drafts for the
    /// verification to read on the device.
    drafts: Option<Arc<DraftHandOff>>,
    /// The decode step `ModelBackend::greedy` queued, until the next call.
    ahead: Option<QueuedStep>,
    /// Whether the model records layer inputs (then a greedy step hands its own on before
    /// the step it queues ahead overwrites them).
    records_hidden: bool,
    /// The tiers below the pool, once one is kept.
    tiers: Option<GpuTiers>,
    /// What the disk tier held at start-up, until the engine takes it.
    disk_start: Option<DiskTierStart>,
}

impl GpuBackend {
    /// `model` with a pool of `num_blocks` blocks, the last of them the scratch block that
    /// padded graph rows write (no sequence owns it), verifying up to `drafts` drafts a
    /// sequence.
    fn new(
        model: GpuLlama,
        kernels: Arc<CudaKernels>,
        capacity: StepCapacity,
        num_blocks: u64,
        drafts: usize,
        s: &GpuSettings,
    ) -> anyhow::Result<GpuBackend> {
        let gpu = model.gpu().clone();
        let scratch_block = u32::try_from(num_blocks - 1)?;
        let layout = model.kv_layout(num_blocks, s.block_size as u64);
        let audit = audit(&layout, 2).map_err(|e| anyhow::anyhow!("address audit: {e}"))?;
        let cache = model.new_cache(num_blocks, s.block_size as u64)?;
        let kernels_audited = if model.config().mla.is_some() {
            "mla_prepare, mla_decode_split"
        } else {
            "kv_write, paged_attention"
        };
        let pool = PoolInfo {
            layout,
            bytes_per_layer: cache.bytes_per_layer(),
            audit,
            kernels: kernels_audited,
            computed_in: "i64",
            device: format!("{} ({})", gpu.name(), gpu.arch()),
            scratch_block: Some(scratch_block),
        };
        Ok(GpuBackend {
            graphs: None,
            verify_graphs: None,
            verify_rows: 1 + drafts,
            model,
            kernels,
            capacity,
            cache: Arc::new(Mutex::new(cache)),
            pool,
            max_seq_len_to_capture: s.max_seq_len_to_capture,
            hidden: None,
            ring: None,
            drafts: None,
            ahead: None,
            records_hidden: false,
            tiers: None,
            disk_start: None,
        })
    }
}

impl GpuBackend {
    /// The device, the kernels and the feature ring, held apart from the backend's borrows.
    fn handles(&self) -> (Arc<Gpu>, Arc<CudaKernels>, Option<Arc<FeatureRing>>) {
        let gpu = self.model.gpu().clone();
        (gpu, self.kernels.clone(), self.ring.clone())
    }

    /// Replays the graph that serves this step, if every row is a logit row, in order, and
    /// a captured size and context class hold it: a decode graph for pure decode (one row a
    /// sequence), else a verification graph when no sequence has more rows than the last
    /// token and every draft; `None` leaves it to the eager forward. Drops any step queued
    /// ahead.
    fn replay(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Option<ReplayedStep<'_>>> {
        self.ahead = None;
        let graph = self.decode_graph(tokens, plan, logit_rows);
        match graph.or_else(|| self.verify_graph(tokens, plan, logit_rows)) {
            Some(graph) => Ok(Some(graph.replay(tokens, plan)?)),
            None => Ok(None),
        }
    }

    /// The verification graph that serves this step: every row a logit row, in order, no
    /// sequence with more rows than the last token and every draft, within a captured size
    /// and the contexts the graphs serve.
    fn verify_graph(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> Option<&CapturedDecode> {
        let seqs = plan.seqs();
        if !logit_rows.iter().copied().eq(0..tokens.len())
            || seqs.iter().any(|s| s.q_len > self.verify_rows)
        {
            return None;
        }
        let (_, graph) = self.verify_graphs.as_ref()?.graph_for(tokens.len())?;
        (longest_context(plan) <= graph.max_context()).then_some(graph)
    }

    /// The hand-off drafts are read from; an error where no head leaves any.
    fn drafts(&self) -> anyhow::Result<Arc<DraftHandOff>> {
        self.drafts
            .clone()
            .context("drafts on the device were named, but no draft head hands any off")
    }

    /// The decode graph that serves this step: one token and one logit row per sequence,
    /// in order, within a captured size and the contexts the graphs serve.
    fn decode_graph(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> Option<&CapturedDecode> {
        if !is_decode_step(tokens, plan, logit_rows) {
            return None;
        }
        let (_, graph) = self.graphs.as_ref()?.graph_for(tokens.len())?;
        (longest_context(plan) <= graph.max_context()).then_some(graph)
    }
}

/// The row offsets of `groups` where they tile `0..rows` in order (each one's start the
/// end of the one before), as a verification graph's verdicts take them.
fn tiling_starts(groups: &[Range<usize>], rows: usize) -> Option<Vec<usize>> {
    let mut starts = vec![0];
    for g in groups {
        (g.start == *starts.last()? && g.end > g.start).then_some(())?;
        starts.push(g.end);
    }
    (*starts.last()? == rows).then_some(starts)
}

/// The longest context of a planned step.
fn longest_context(plan: &AttentionPlan) -> usize {
    plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0)
}

/// Hands on the recorded layer inputs `aux` (when the forward recorded some): stored into
/// `ring` on the target's stream where there is one, else downloaded.
fn hand_off(
    gpu: &Gpu,
    kernels: &CudaKernels,
    ring: Option<&FeatureRing>,
    aux: Option<CudaView<f32>>,
) -> anyhow::Result<Option<HiddenData>> {
    let Some(aux) = aux else {
        return Ok(None);
    };
    Ok(Some(match ring {
        Some(ring) => {
            let rows = aux.len() / ring.width();
            let first = ring
                .store(kernels, gpu.stream(), &aux, rows)
                .context("storing the recorded layer inputs into the feature ring")?;
            HiddenData::Ring { first, rows }
        }
        None => HiddenData::Host(gpu.download(&aux)?),
    }))
}

/// Samples every row of the device `logits` (`[sampling.len(), vocab]`) under its grammar
/// mask, waited for only now that the forward is queued: on the device, masks included (one
/// upload of the masked rows' words, one download of the chosen ids), unless a row asks for
/// logprobs: then the logits come to the host and the CPU samples, as it would (logprobs
/// of the unmasked row).
fn sample_logits(
    gpu: &Gpu,
    kernels: &CudaKernels,
    logits: &CudaView<f32>,
    vocab: usize,
    sampling: &mut [RowSampling],
    masks: RowMasks,
) -> anyhow::Result<Vec<GeneratedToken>> {
    let masks = masks.wait(sampling.len())?;
    if sampling.iter().any(|s| s.logprobs.is_some()) {
        let host = gpu.download(logits)?;
        return Ok(sample_on_host(&host, vocab, sampling, &masks));
    }
    let mut requests: Vec<SampleRequest> = sampling
        .iter_mut()
        .zip(&masks)
        .map(|(s, mask)| SampleRequest {
            sampler: &mut *s.sampler,
            prompt_tokens: s.prompt,
            output_tokens: s.output,
            mask: mask.as_ref(),
        })
        .collect();
    let ids = GpuSampler::new(kernels, gpu).sample_view(logits, vocab, &mut requests)?;
    Ok(ids
        .into_iter()
        .map(|id| GeneratedToken { id, logprobs: None })
        .collect())
}

impl ModelBackend for GpuBackend {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn host_waits_on_device(&self) -> bool {
        true
    }

    fn pool(&self) -> &PoolInfo {
        &self.pool
    }

    fn capacity(&self) -> Option<StepCapacity> {
        Some(self.capacity)
    }

    /// Drops the decode graphs captured before, which do not record the layers: capture
    /// them again.
    fn record_hidden(&mut self, layers: &[usize]) -> anyhow::Result<()> {
        self.ahead = None;
        self.model.record_aux(layers)?;
        self.records_hidden = !layers.is_empty();
        let sizes = self.graphs.take().map(|g| g.sizes().clone());
        match sizes {
            Some(sizes) => self.capture_graphs(Some(&sizes)),
            None => Ok(()),
        }
    }

    /// A tier of page-locked host memory (`host_blocks.rs`).
    fn keep_host_tier(&mut self, bytes: u64) -> anyhow::Result<u32> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let tiers = match &mut self.tiers {
            Some(tiers) => tiers,
            none => none.insert(GpuTiers::new(self.model.gpu(), &cache)?),
        };
        tiers.keep_host(&cache, bytes)
    }

    fn host_tier_slots(&self) -> u32 {
        self.tiers.as_ref().map_or(0, GpuTiers::host_slots)
    }

    /// A tier in the model's file under `dir` (`disk_blocks.rs`).
    fn keep_disk_tier(
        &mut self,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<()> {
        let gpu = self.model.gpu().clone();
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let tiers = match &mut self.tiers {
            Some(tiers) => tiers,
            none => none.insert(GpuTiers::new(&gpu, &cache)?),
        };
        self.disk_start = Some(tiers.keep_disk(&gpu, &cache, dir, bytes, model)?);
        Ok(())
    }

    fn take_disk_tier(&mut self) -> Option<DiskTierStart> {
        self.disk_start.take()
    }

    /// Queues the copies on the target's stream, after any step queued ahead (which it
    /// drops) and before the next step; disk writes and reads go to the disk tier's thread
    /// ([`GpuTiers::apply`]).
    fn move_kv(&mut self, moves: &[KvMove]) -> anyhow::Result<()> {
        if moves.is_empty() {
            return Ok(());
        }
        self.ahead = None;
        let (gpu, kernels) = (self.model.gpu().clone(), self.kernels.clone());
        let tiers = self.tiers.as_mut().ok_or_else(|| {
            anyhow::anyhow!("KV tier moves for a GPU backend that keeps no tier below its pool")
        })?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        tiers.apply(&gpu, &kernels, &mut cache, moves)
    }

    /// Copies the finished disk reads in on the target's stream. A step queued ahead
    /// stands: it read none of these blocks, which belong to sequences held out of every
    /// step until now.
    fn finish_loads(&mut self, wait: bool) -> anyhow::Result<Vec<LoadDone>> {
        let Some(tiers) = &mut self.tiers else {
            return Ok(Vec::new());
        };
        let (gpu, kernels) = (self.model.gpu().clone(), self.kernels.clone());
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        tiers.finish_loads(&gpu, &kernels, &mut cache, wait)
    }

    /// The decode graphs, and with speculation the verification graphs: for each size, one
    /// of as many sequences of `1 + num_speculative_tokens` rows; on failure the graphs held
    /// before stay.
    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.ahead = None;
        let Some(sizes) = sizes else {
            self.graphs = None;
            self.verify_graphs = None;
            return Ok(());
        };
        let scratch = self.pool.scratch_block.unwrap_or_default() as i64;
        let limits = GraphLimits {
            max_rows: sizes.largest(),
            max_context: self
                .max_seq_len_to_capture
                .min(self.model.config().max_model_len),
            scratch_slot: scratch * self.pool.layout.block_size as i64,
        };
        let (model, cache) = (&mut self.model, &self.cache);
        let graphs = GraphCaptureManager::capture(sizes.clone(), |size| {
            model.capture_decode(size, limits, cache)
        })?;
        let verify_graphs = match self.verify_rows {
            1 => None,
            per_seq => {
                let rows = sizes.scaled(per_seq);
                let limits = GraphLimits {
                    max_rows: rows.largest(),
                    ..limits
                };
                let graphs = GraphCaptureManager::capture(rows, |size| {
                    model.capture_verify(size, limits, cache)
                });
                Some(graphs.context("capturing the verification graphs")?)
            }
        };
        self.graphs = Some(graphs);
        self.verify_graphs = verify_graphs;
        Ok(())
    }

    /// Through a decode graph where one serves the step, else eagerly; sampled by
    /// `sample_logits`.
    fn sampled(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        sampling: &mut [RowSampling],
        masks: RowMasks,
    ) -> anyhow::Result<Vec<GeneratedToken>> {
        let vocab = self.model.config().vocab_size;
        let (gpu, kernels, ring) = self.handles();
        let ring = ring.as_deref();
        let mut masks = Some(masks);
        let mut take_masks = || masks.take().context("a step's masks were taken twice");
        let replayed = match self.replay(tokens, plan, logit_rows)? {
            Some(r) => {
                let hidden = hand_off(&gpu, &kernels, ring, r.aux())?;
                let logits = r.logits();
                Some((
                    sample_logits(&gpu, &kernels, &logits, vocab, sampling, take_masks()?)?,
                    hidden,
                ))
            }
            None => None,
        };
        if let Some((sampled, hidden)) = replayed {
            self.hidden = hidden;
            return Ok(sampled);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.model.forward(tokens, plan, &mut cache, logit_rows)?;
        drop(cache);
        self.hidden = hand_off(&gpu, &kernels, ring, self.model.last_aux(tokens.len()))?;
        let logits = self.model.last_logits(logit_rows.len());
        sample_logits(&gpu, &kernels, &logits, vocab, sampling, take_masks()?)
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    /// The argmax on the device (inside the graph, where one serves the step), one
    /// download of the ids.
    fn argmax(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<u32>> {
        let (gpu, kernels, ring) = self.handles();
        let ring = ring.as_deref();
        let replayed = match self.replay(tokens, plan, logit_rows)? {
            Some(r) => {
                let hidden = hand_off(&gpu, &kernels, ring, r.aux())?;
                Some((r.greedy_ids()?, hidden))
            }
            None => None,
        };
        if let Some((ids, hidden)) = replayed {
            self.hidden = hidden;
            return Ok(ids);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.model.forward(tokens, plan, &mut cache, logit_rows)?;
        drop(cache);
        self.hidden = hand_off(&gpu, &kernels, ring, self.model.last_aux(tokens.len()))?;
        Ok(self.model.last_argmax(logit_rows.len())?)
    }

    /// Through a verification graph where one serves the step (every logit row one group
    /// of a sequence, in order): the drafts written into its token ids on the device and
    /// the verdicts judged there, read back once with the ids. Else the drafts read back
    /// first, the step run as [`ModelBackend::argmax`] runs it and judged on the host.
    fn verify_fed(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
        fed: &[(usize, HandedDraft)],
        groups: &[Range<usize>],
    ) -> anyhow::Result<(Vec<u32>, Vec<usize>)> {
        let (gpu, kernels, ring) = self.handles();
        let drafts = self.drafts()?;
        self.ahead = None;
        let starts = tiling_starts(groups, logit_rows.len());
        let replayed = match (self.verify_graph(tokens, plan, logit_rows), starts) {
            (Some(graph), Some(starts)) => {
                let mut r = graph.replay_fed(tokens, plan, &drafts, fed)?;
                let hidden = hand_off(&gpu, &kernels, ring.as_deref(), r.aux())?;
                Some((r.greedy_verdicts(&starts)?, hidden))
            }
            _ => None,
        };
        if let Some((verdicts, hidden)) = replayed {
            self.hidden = hidden;
            return Ok(verdicts);
        }
        let which: Vec<HandedDraft> = fed.iter().map(|&(_, d)| d).collect();
        let got = drafts.fetch(gpu.stream(), &which)?;
        let mut tokens = tokens.to_vec();
        let rows = tokens.len();
        for (&(row, _), &token) in fed.iter().zip(&got) {
            let at = tokens.get_mut(row);
            *at.with_context(|| format!("a draft fed into row {row} of {rows}"))? = token;
        }
        let ids = self.argmax(&tokens, plan, logit_rows)?;
        let accepted = greedy_verdicts(&ids, &tokens, logit_rows, groups);
        Ok((ids, accepted))
    }

    fn fetch_drafts(&mut self, which: &[HandedDraft]) -> anyhow::Result<Vec<u32>> {
        let gpu = self.model.gpu().clone();
        Ok(self.drafts()?.fetch(gpu.stream(), which)?)
    }

    /// One download of the picked rows' logits after the forward.
    fn logits(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        let (gpu, kernels, ring) = self.handles();
        let ring = ring.as_deref();
        let replayed = match self.replay(tokens, plan, logit_rows)? {
            Some(r) => {
                let hidden = hand_off(&gpu, &kernels, ring, r.aux())?;
                Some((gpu.download(&r.logits())?, hidden))
            }
            None => None,
        };
        if let Some((logits, hidden)) = replayed {
            self.hidden = hidden;
            return Ok(logits);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.model.forward(tokens, plan, &mut cache, logit_rows)?;
        drop(cache);
        self.hidden = hand_off(&gpu, &kernels, ring, self.model.last_aux(tokens.len()))?;
        Ok(gpu.download(&self.model.last_logits(logit_rows.len()))?)
    }

    /// Through the decode graph that serves the step (else eagerly, queuing nothing): the
    /// ids come back through page-locked memory after `next` is queued; the masks are
    /// waited for once the step is queued, and applied on the device.
    fn greedy(
        &mut self,
        source: StepSource,
        next: Option<&AttentionPlan>,
        masks: RowMasks,
    ) -> anyhow::Result<(Vec<u32>, bool)> {
        let queued = self.ahead.take();
        let (graph, input, rows) = match source {
            StepSource::Fresh {
                tokens,
                plan,
                logit_rows,
            } => match self.decode_graph(tokens, plan, logit_rows) {
                Some(graph) => (graph, GreedyInput::Host { tokens, plan }, logit_rows.len()),
                None => {
                    let ids = self.masked_argmax(tokens, plan, logit_rows, masks)?;
                    return Ok((ids, false));
                }
            },
            StepSource::Queued => {
                let queued = queued.context("no step was queued ahead")?;
                let graph = self
                    .graphs
                    .as_ref()
                    .and_then(|g| g.graph_for(queued.graph_size()))
                    .map(|(_, graph)| graph)
                    .context("the graph a step was queued on is gone")?;
                let rows = queued.rows();
                (graph, GreedyInput::Queued(queued), rows)
            }
        };
        let next = next.filter(|n| longest_context(n) <= graph.max_context());
        let masks: Option<StepMasks> = match masks {
            RowMasks::None => None,
            masks => Some(Box::new(move || masks.wait(rows))),
        };
        // The features the step recorded go to the ring (or the host) before the step
        // queued ahead overwrites them.
        let mut hidden = None;
        let hand_off: Option<AuxHandOff> = match self.records_hidden {
            true => {
                let (gpu, kernels, ring) = (self.model.gpu(), &self.kernels, self.ring.as_deref());
                let hidden = &mut hidden;
                Some(Box::new(move |aux: CudaView<f32>| {
                    *hidden = hand_off(gpu, kernels, ring, Some(aux))
                        .map_err(|e| GpuForwardError::HandOff(format!("{e:#}")))?;
                    Ok(())
                }))
            }
            false => None,
        };
        let (ids, queued) = graph.greedy_step_handing_off(input, next, masks, hand_off)?;
        self.hidden = hidden;
        let ahead = queued.is_some();
        self.ahead = queued;
        Ok((ids, ahead))
    }

    fn take_hidden(&mut self) -> Option<HiddenData> {
        self.hidden.take()
    }
}
