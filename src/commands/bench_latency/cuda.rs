//! The GPU model for `bench latency`: a checkpoint or random weights of a config.json's
//! shapes, in bf16.

use super::backend::{blocks_needed, LatencyModel, StepTokens};
use super::mtp_round::{MtpRound, RoundShape};
use crate::cli::BenchLatencyArgs;
use anyhow::Context;
use peregrine_actors::graphs::{is_decode_step, CaptureSizes, GraphCaptureManager};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_kernels::gemv_max_rows_for;
use peregrine_models::fetch::default_cache_dir;
use peregrine_models::graph::cuda::{GraphLimits, SharedKvCache};
use peregrine_models::llama::cuda::{
    CapturedDecode, GpuLlama, GpuModelOptions, GreedyInput, QueuedStep,
};
use peregrine_models::ModelConfig;
use peregrine_ops::AttentionPlan;
use peregrine_runtime::cuda::Gpu;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct GpuModel {
    /// Decode graphs, one per batch size timed (none with --enforce-eager).
    graphs: Option<GraphCaptureManager<CapturedDecode>>,
    /// Verification graphs of --verify-rows rows a sequence, one per batch size timed (none
    /// with --enforce-eager or one row).
    verify_graphs: Option<GraphCaptureManager<CapturedDecode>>,
    /// Rows a sequence of a verification step.
    verify_rows: usize,
    /// The step `step_ahead` queued last, until the next call reads it.
    queued: Option<QueuedStep>,
    model: GpuLlama,
    cache: SharedKvCache,
    /// The multi-token prediction layer's rounds (`--mtp-drafts`).
    mtp: Option<MtpRound>,
    /// Drafts a round chains.
    mtp_drafts: usize,
    source: String,
    products: String,
}

impl GpuModel {
    /// Opens device 0, compiles the kernels and loads or makes the model.
    pub fn open(args: &BenchLatencyArgs) -> anyhow::Result<GpuModel> {
        let largest = args.batch_sizes.iter().copied().max().unwrap_or(1);
        let verify_rows = args.verify_rows.max(1);
        let gpu = Arc::new(Gpu::open(0)?);
        let cache_dir = default_cache_dir(args.model.cache_dir.as_deref())?.join("kernels");
        let mut kernels = CudaKernels::load(&gpu, &cache_dir)?;
        if args.no_programmatic_launch {
            kernels = kernels.without_programmatic_launch();
        }
        if args.no_tensor_cores {
            kernels = kernels.without_tensor_cores();
        }
        let programmatic = kernels.programmatic_launch();
        let kernels = Arc::new(kernels);
        let (config, dir, source) = match &args.random_weights {
            Some(config) => {
                let text = std::fs::read_to_string(config)
                    .with_context(|| format!("reading {}", config.display()))?;
                let parsed = ModelConfig::from_json(&text)
                    .with_context(|| format!("parsing {}", config.display()))?;
                (
                    parsed,
                    None,
                    format!("random weights of {}", config.display()),
                )
            }
            None => {
                let dir = crate::commands::resolve_model(&args.model)?;
                let source = dir.display().to_string();
                (ModelConfig::from_dir(&dir)?, Some(dir), source)
            }
        };
        let gemv_max_rows = args
            .gemv_max_rows
            .unwrap_or_else(|| gemv_max_rows_for(config.hidden_size));
        let options = GpuModelOptions {
            max_tokens: largest * args.input_len.max(verify_rows),
            max_logit_rows: largest * verify_rows,
            deterministic: args.deterministic,
            gemv_max_rows,
        };
        let mut model = match &dir {
            Some(dir) => GpuLlama::load(dir, gpu.clone(), kernels.clone(), options)?,
            None => GpuLlama::random(config, 0, gpu.clone(), kernels.clone(), options)?,
        };
        // One block more than the sequences use: the scratch block padded graph rows write.
        let blocks = blocks_needed(args, largest) + 1;
        let cache = model.new_cache(blocks, args.block_size as u64)?;
        let cache = Arc::new(Mutex::new(cache));
        let mut products = if args.deterministic {
            "products by the batch-invariant kernels (tensor cores, else the GEMV)".to_string()
        } else {
            format!("products by the GEMV kernel up to {gemv_max_rows} rows, cuBLAS above")
        };
        if !programmatic {
            products.push_str(", no programmatic dependent launch");
        }
        if args.no_tensor_cores {
            products.push_str(", prefill attention on CUDA cores (--no-tensor-cores)");
        }
        let (graphs, verify_graphs) = if args.enforce_eager {
            products.push_str(", eager decode (--enforce-eager)");
            (None, None)
        } else {
            let limits = GraphLimits {
                max_rows: largest,
                max_context: args.max_seq_len_to_capture,
                scratch_slot: ((blocks - 1) * args.block_size as u64) as i64,
            };
            let sizes = CaptureSizes::from_list(&args.batch_sizes, largest)
                .map_err(|e| anyhow::anyhow!("--batch-sizes: {e}"))?;
            let start = Instant::now();
            let graphs = GraphCaptureManager::capture(sizes.clone(), |size| {
                model.capture_decode(size, limits, &cache)
            })?;
            products.push_str(&format!(
                ", decode through CUDA graphs ({} sizes captured in {:.2} s)",
                graphs.sizes().sizes().len(),
                start.elapsed().as_secs_f64()
            ));
            let verify_graphs = (verify_rows > 1)
                .then(|| {
                    let rows = sizes.scaled(verify_rows);
                    let limits = GraphLimits {
                        max_rows: rows.largest(),
                        ..limits
                    };
                    GraphCaptureManager::capture(rows, |size| {
                        model.capture_verify(size, limits, &cache)
                    })
                })
                .transpose()?;
            (Some(graphs), verify_graphs)
        };
        let mtp = (args.mtp_drafts > 0)
            .then(|| {
                let sizes = CaptureSizes::from_list(&args.batch_sizes, largest)
                    .map_err(|e| anyhow::anyhow!("--batch-sizes: {e}"))?;
                let head_options = GpuModelOptions {
                    max_logit_rows: largest,
                    ..options
                };
                let blocks = (blocks, args.block_size);
                let context = args.max_seq_len_to_capture;
                let kernels = kernels.clone();
                MtpRound::new(
                    &model,
                    dir.as_deref(),
                    kernels,
                    head_options,
                    blocks,
                    &sizes,
                    verify_rows,
                    context,
                )
                .context("the multi-token prediction layer (--mtp-drafts)")
            })
            .transpose()?;
        if mtp.is_some() {
            products.push_str(", an MTP layer beside it on a stream of its own");
        }
        Ok(GpuModel {
            graphs,
            verify_graphs,
            verify_rows,
            queued: None,
            model,
            cache,
            mtp,
            mtp_drafts: args.mtp_drafts,
            source,
            products,
        })
    }

    /// The graph a step replays through: a decode graph for pure decode, a verification
    /// graph for a step of at most --verify-rows rows a sequence whose every row is a
    /// logit row, in order; `None` past the largest captured size or context (such a step
    /// runs eagerly, as the engine's does), or with --enforce-eager.
    fn graph_for(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> Option<&CapturedDecode> {
        let graphs = if is_decode_step(tokens, plan, logit_rows) {
            self.graphs.as_ref()?
        } else if logit_rows.iter().copied().eq(0..tokens.len())
            && plan.seqs().iter().all(|s| s.q_len <= self.verify_rows)
        {
            self.verify_graphs.as_ref()?
        } else {
            return None;
        };
        let longest = plan.seqs().iter().map(|s| s.context_len).max().unwrap_or(0);
        graphs
            .graph_for(tokens.len())
            .map(|(_, graph)| graph)
            .filter(|graph| longest <= graph.max_context())
    }
}

impl LatencyModel for GpuModel {
    fn describe(&self) -> String {
        let c = self.model.config();
        let gpu = self.model.gpu();
        format!(
            "model: {} ({:?}, {} layers, hidden {}), on {} ({}) in bf16, {}, {:.2} GB of weights",
            self.source,
            c.architecture,
            c.num_layers,
            c.hidden_size,
            gpu.name(),
            gpu.arch(),
            self.products,
            self.model.weight_bytes() as f64 / 1e9
        )
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn num_blocks(&self) -> u64 {
        self.cache.lock().map_or(0, |c| c.layout().num_blocks)
    }

    fn weight_bytes(&self) -> u64 {
        self.model.weight_bytes()
    }

    fn routed_step_bytes(&self, batch: usize, context: usize) -> Option<u64> {
        self.model.routed_step_bytes(batch, context)
    }

    fn decode_floor_ms(&mut self) -> anyhow::Result<Option<f64>> {
        let gpu = self.model.gpu().clone();
        let bytes = 1usize << 30;
        let src = gpu.zeros::<u8>(bytes)?;
        let mut dst = gpu.zeros::<u8>(bytes)?;
        gpu.stream().memcpy_dtod(&src, &mut dst)?;
        gpu.synchronize()?;
        let rounds = 20;
        let start = Instant::now();
        for _ in 0..rounds {
            gpu.stream().memcpy_dtod(&src, &mut dst)?;
        }
        gpu.synchronize()?;
        // A copy reads and writes every byte.
        let bandwidth = (2 * bytes * rounds) as f64 / start.elapsed().as_secs_f64();
        Ok(Some(self.model.weight_bytes() as f64 / bandwidth * 1e3))
    }

    fn draft_round_ms(&mut self, batch: usize, context: usize) -> anyhow::Result<Option<f64>> {
        let drafts = self.mtp_drafts;
        let Some(mtp) = &mut self.mtp else {
            return Ok(None);
        };
        let shape = RoundShape { context, drafts };
        Ok(Some(mtp.time(batch, shape, 20)?))
    }

    fn step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<StepTokens> {
        if let Some(graph) = self.graph_for(tokens, plan, logit_rows) {
            let replayed = graph.replay(tokens, plan)?;
            let queued = Instant::now();
            let tokens = replayed.greedy_ids()?;
            return Ok(StepTokens { tokens, queued });
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.model.forward(tokens, plan, &mut cache, logit_rows)?;
        // The argmax's two launches are left out of the queued time: they are queued just
        // before the download that waits.
        let queued = Instant::now();
        let tokens = self.model.last_argmax(logit_rows.len())?;
        Ok(StepTokens { tokens, queued })
    }

    fn replays_step(&self, batch: usize, rows: usize, context: usize) -> bool {
        let graphs = match rows {
            1 => self.graphs.as_ref(),
            _ if rows <= self.verify_rows => self.verify_graphs.as_ref(),
            _ => None,
        };
        graphs
            .and_then(|graphs| graphs.graph_for(batch * rows))
            .is_some_and(|(_, graph)| context <= graph.max_context())
    }

    fn queue_step(
        &mut self,
        tokens: &[u32],
        plan: &AttentionPlan,
        logit_rows: &[usize],
    ) -> anyhow::Result<()> {
        let Some(graph) = self.graph_for(tokens, plan, logit_rows) else {
            anyhow::bail!("no graph replays this step");
        };
        // Dropping the replayed step leaves its work queued.
        drop(graph.replay(tokens, plan)?);
        Ok(())
    }

    fn step_ahead(
        &mut self,
        batch: usize,
        step: Option<(&[u32], &AttentionPlan)>,
        next: Option<&AttentionPlan>,
    ) -> anyhow::Result<Vec<u32>> {
        let queued = self.queued.take();
        let Some((_, graph)) = self.graphs.as_ref().and_then(|g| g.graph_for(batch)) else {
            anyhow::bail!("no graph replays a decode step of {batch} sequences");
        };
        let input = match step {
            Some((tokens, plan)) => GreedyInput::Host { tokens, plan },
            None => GreedyInput::Queued(queued.context("no step was queued ahead")?),
        };
        let (tokens, queued) = graph.greedy_step(input, next, None)?;
        self.queued = queued;
        Ok(tokens)
    }

    fn synchronize(&mut self) -> anyhow::Result<()> {
        Ok(self.model.gpu().synchronize()?)
    }
}
