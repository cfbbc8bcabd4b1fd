//! `--speculative-method mtp` through the serving engine on the CPU: DeepSeek-V3's
//! multi-token prediction layer (random, on the V3 fixture) drafts three tokens a step,
//! chained on its own output, the target and the head replaying captured graphs, and every
//! greedy request's output equals the plainest loop's (the model alone, no batch, no
//! drafts), in a roomy pool and in one tight enough to preempt.

mod common;

use common::engine::{collect, requests, solo, submit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use peregrine_actors::backend::cpu_backend;
use peregrine_actors::draft::{CpuMtpHead, DraftMethod, Eagle3};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::SchedulerLimits;
use peregrine_models::mtp::MtpHead;
use peregrine_models::{LlamaModel, Weights};
use std::path::Path;

const BLOCK: usize = 16;
const MAX_TOKENS: usize = 16;

/// The outputs of `reqs` served together with MTP drafting `k` a step, over a pool of
/// `kv_blocks` blocks.
async fn served(
    dir: &Path,
    reqs: &[(Vec<u32>, peregrine_ops::sampling::SamplingParams)],
    kv_blocks: u64,
    k: usize,
) -> Vec<Vec<u32>> {
    let model = LlamaModel::load(dir).unwrap();
    let (embed, head) = (model.embedding_table(), model.lm_head());
    let (config, bytes) = (model.config().clone(), model.kv_bytes_per_token());
    let target = cpu_backend(model, kv_blocks * BLOCK as u64 * bytes, BLOCK).unwrap();
    let weights = Weights::open(dir).unwrap();
    let mtp = MtpHead::from_weights(&config, &weights, embed, head).unwrap();
    let runner = CpuMtpHead::new(mtp, &config, target.pool()).unwrap();
    let drafter: Box<dyn DraftMethod> = Box::new(Eagle3::with_runner(runner));
    let settings = EngineSettings {
        block_size: BLOCK,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            max_waiting: 1000,
            num_speculative_tokens: k,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, Some(drafter)).unwrap();
    // The target's decode steps and the head's draft steps replay graphs.
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 8).unwrap();
    engine.graphs.capture(Some(sizes)).await.unwrap();
    let mut streams = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        streams.push(submit(&engine.scheduler, i as u64, prompt, params, MAX_TOKENS).await);
    }
    let mut out = Vec::new();
    for rx in streams {
        out.push(collect(rx).await.0);
    }
    out
}

#[tokio::test]
async fn mtp_drafting_keeps_every_greedy_output() {
    let dir = tempfile::tempdir().unwrap();
    common::mtp_checkpoint::write(dir.path(), 21);
    let reqs = requests(320, 10, 5);
    let want = solo(dir.path(), &reqs, MAX_TOKENS);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    for (kv_blocks, what) in [(64, "roomy pool"), (7, "tight pool")] {
        let got = served(dir.path(), &reqs, kv_blocks, 3).await;
        for (i, ((req, w), g)) in reqs.iter().zip(&want).zip(&got).enumerate() {
            assert_eq!(g.len(), MAX_TOKENS, "request {i}, {what}");
            if req.1.is_greedy() {
                assert_eq!(g, w, "request {i}, {what}");
            }
        }
        let snapshot = snapshotter.snapshot().into_vec();
        let count = |name: &str| -> u64 {
            snapshot
                .iter()
                .filter(|(key, ..)| key.key().name() == name)
                .map(|(.., value)| match value {
                    DebugValue::Counter(c) => *c,
                    _ => 0,
                })
                .sum()
        };
        assert!(
            count("peregrine:spec_decode_num_draft_tokens_total") > 0,
            "{what}: no drafts"
        );
        if kv_blocks == 7 {
            assert!(
                count("peregrine:num_preemptions_total") > 0,
                "{what}: no preemption"
            );
        }
    }
}
