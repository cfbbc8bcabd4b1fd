//! `bench latency --mtp-drafts K`: what a drafting round of the model's multi-token
//! prediction layer costs beside its decode step, on the GPU. The layer (the checkpoint's,
//! or random weights of its shapes) runs through the engine's head runner: step 0 over each
//! sequence's `--verify-rows` rows fed the target's outputs through the feature ring (the
//! step-0 graph), then K - 1 chained draft steps (the draft-step graphs), drafts downloaded
//! after each as the engine's proposer does.

use peregrine_actors::draft::{GpuHead, HeadCapacity, HeadRunner};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::eagle3::HeadInput;
use peregrine_models::llama::cuda::{GpuLlama, GpuModelOptions};
use peregrine_models::mtp::cuda::{GpuMtpHead, MtpCore};
use peregrine_ops::SeqSpec;
use peregrine_runtime::cuda::Gpu;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The layer's runner with its own cache, and the ring its step 0 reads.
pub struct MtpRound {
    runner: GpuHead<MtpCore>,
    ring: Arc<FeatureRing>,
    gpu: Arc<Gpu>,
    kernels: Arc<CudaKernels>,
    /// Rows a sequence verifies (and step 0 runs).
    verify_rows: usize,
    block_size: usize,
}

/// What a round drafts for each sequence.
pub struct RoundShape {
    /// Tokens the sequence holds before the verification step the round follows.
    pub context: usize,
    /// Drafts the round chains (K).
    pub drafts: usize,
}

impl MtpRound {
    /// The layer of `dir` (random weights of `model`'s shapes without one) beside `model`
    /// on a stream of its own, over a cache of `num_blocks` blocks of `block_size` tokens
    /// (the last the graphs' scratch block), with graphs for `sizes` sequences of contexts
    /// up to `max_context`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: &GpuLlama,
        dir: Option<&Path>,
        kernels: Arc<CudaKernels>,
        options: GpuModelOptions,
        (num_blocks, block_size): (u64, usize),
        sizes: &CaptureSizes,
        verify_rows: usize,
        max_context: usize,
    ) -> anyhow::Result<MtpRound> {
        let gpu = Arc::new(Gpu::open(0)?);
        let (c, shared) = (model.config(), model.shared_embedding());
        let mut head = match dir {
            Some(dir) => GpuMtpHead::load(dir, c, shared, gpu.clone(), kernels.clone(), options)?,
            None => GpuMtpHead::random(c, shared, 1, gpu.clone(), kernels.clone(), options)?,
        };
        let ring = Arc::new(FeatureRing::new(
            &gpu,
            4 * options.max_tokens,
            c.hidden_size,
        )?);
        head.read_features_from(ring.clone())?;
        let cache = head.new_cache(head.kv_layout(num_blocks, block_size as u64))?;
        let capacity = HeadCapacity {
            max_tokens: options.max_tokens,
            max_logit_rows: options.max_logit_rows,
            first_rows: verify_rows,
        };
        let scratch_slot = ((num_blocks - 1) * block_size as u64) as i64;
        let cache = Arc::new(Mutex::new(cache));
        let mut runner = GpuHead::new(head, cache, capacity, scratch_slot, max_context);
        runner.capture_graphs(Some(sizes))?;
        Ok(MtpRound {
            runner,
            ring,
            gpu,
            kernels,
            verify_rows,
            block_size,
        })
    }

    /// The mean wall time in ms of `rounds` drafting rounds of `batch` sequences of `shape`
    /// (after two untimed ones).
    pub fn time(&mut self, batch: usize, shape: RoundShape, rounds: usize) -> anyhow::Result<f64> {
        let rows = self.verify_rows;
        let longest = shape.context + rows + shape.drafts;
        let per_seq = longest.div_ceil(self.block_size) as u32;
        let tables: Vec<Vec<u32>> = (0..batch as u32)
            .map(|s| (s * per_seq..(s + 1) * per_seq).collect())
            .collect();
        let h = self.runner.hidden_size();
        let outputs = self.gpu.upload(&vec![0.25f32; batch * rows * h])?;
        let mut total = 0.0;
        for round in 0..rounds + 2 {
            // The target's outputs of its verification step, handed off as it would.
            let stream = self.gpu.stream();
            let first = self
                .ring
                .store(&self.kernels, stream, &outputs.as_view(), batch * rows)?;
            self.gpu.synchronize()?;
            let start = Instant::now();
            self.round(&tables, shape.context, shape.drafts, first)?;
            if round >= 2 {
                total += start.elapsed().as_secs_f64();
            }
        }
        Ok(total * 1e3 / rounds as f64)
    }

    /// One round over the sequences of `tables`: step 0 then `drafts - 1` chained steps.
    fn round(
        &mut self,
        tables: &[Vec<u32>],
        context: usize,
        drafts: usize,
        first_ring_row: u64,
    ) -> anyhow::Result<()> {
        let (batch, rows, h) = (tables.len(), self.verify_rows, self.runner.hidden_size());
        let specs: Vec<SeqSpec> = tables
            .iter()
            .map(|t| SeqSpec {
                num_cached: context,
                num_new: rows,
                block_table: t,
            })
            .collect();
        let tokens: Vec<u32> = (0..batch * rows).map(|i| 3 + i as u32 % 97).collect();
        let ids: Vec<u64> = (first_ring_row..first_ring_row + (batch * rows) as u64).collect();
        let lasts: Vec<usize> = (0..batch).map(|s| s * rows + rows - 1).collect();
        let out = self
            .runner
            .run(&specs, &tokens, HeadInput::Ring(&ids), &lasts, false)?;
        let (mut drafted, mut pre): (Vec<u32>, Vec<f32>) = (
            out.greedy,
            lasts
                .iter()
                .flat_map(|&r| out.pre[r * h..(r + 1) * h].to_vec())
                .collect(),
        );
        let every: Vec<usize> = (0..batch).collect();
        for step in 1..drafts {
            let specs: Vec<SeqSpec> = tables
                .iter()
                .map(|t| SeqSpec {
                    num_cached: context + rows + step - 1,
                    num_new: 1,
                    block_table: t,
                })
                .collect();
            let out = self
                .runner
                .run(&specs, &drafted, HeadInput::Pre(&pre), &every, false)?;
            (drafted, pre) = (out.greedy, out.pre);
        }
        Ok(())
    }
}
