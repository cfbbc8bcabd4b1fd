//! The serving engine on the GPU backend: requests through the scheduler, the KV allocator
//! and the target runner with the model on the device, sized by gpu_memory_utilization.
//! In deterministic mode a request's tokens are the same alone and among many others,
//! however the scheduler cuts its prompt into chunks and whatever the prefix cache holds.

use crate::common::eagle3_head::{HeadSpec, RandomHead};
use crate::common::engine::{collect, counter, request_spec, requests, run_all, submit};
use crate::common::first_two::{
    assert_first_two_follow, assert_uniform_drafts_accepted, first_two_distributions,
    one_sequence_plan, DIST_BLOCK_SIZE, DIST_POOL_BLOCKS,
};
use crate::common::served;
use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::eagle3::gpu_head_spec;
use crate::model::{gpu_model, gpu_sized};
use crate::setup;
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::backend::{cuda_backend, GpuSettings, Loaded, ModelBackend};
use peregrine_actors::draft::{DraftMethod, DraftModel, DraftSpec};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{
    Drafted, HiddenRows, ProposeSeq, RequestId, RequestSpec, SchedulerLimits,
};
use peregrine_models::LlamaModel;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::sampling::SamplingParams;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const MAX_TOKENS: usize = 16;

/// The GPU backend's settings for a tiny model: 5% of the device, blocks of 16, steps of up
/// to 64 tokens and 32 sequences, no drafts.
pub fn tiny_settings(deterministic: bool) -> GpuSettings {
    GpuSettings {
        gpu_memory_utilization: 0.05,
        kv_cache_memory: None,
        block_size: 16,
        max_num_batched_tokens: 64,
        max_num_seqs: 32,
        num_speculative_tokens: 0,
        deterministic,
        max_seq_len_to_capture: peregrine_actors::backend::MAX_SEQ_LEN_TO_CAPTURE,
        kernel_cache: std::env::temp_dir().join("peregrine-test-kernels"),
        draft: None,
    }
}

fn gpu_engine(dir: &Path, deterministic: bool) -> peregrine_actors::engine::Engine {
    gpu_engine_drafting(dir, deterministic, |_, built| built, 0, None, false)
}

/// The GPU engine of the model in `dir`, verifying up to `k` drafts a step of the drafter
/// `drafter` returns given the target backend and the drafter it built of `spec`, with
/// async scheduling as `async_scheduling` says; with it, drafts are planned adaptively
/// (drafting every step would leave no plain step to queue ahead).
fn gpu_engine_drafting(
    dir: &Path,
    deterministic: bool,
    drafter: impl FnOnce(
        &mut dyn ModelBackend,
        Option<Box<dyn DraftMethod>>,
    ) -> Option<Box<dyn DraftMethod>>,
    k: usize,
    spec: Option<DraftSpec>,
    async_scheduling: bool,
) -> peregrine_actors::engine::Engine {
    let settings = GpuSettings {
        num_speculative_tokens: k,
        draft: spec,
        ..tiny_settings(deterministic)
    };
    let Loaded {
        target: mut backend,
        drafter: built,
    } = cuda_backend(dir, &settings).unwrap();
    let pool = backend.pool().clone();
    eprintln!(
        "GPU pool: {} blocks, {} bytes per layer, audit: largest byte offset {} in {}",
        pool.layout.num_blocks,
        pool.bytes_per_layer,
        pool.audit.largest_byte_offset,
        pool.computed_in
    );
    let engine = EngineSettings {
        block_size: 16,
        // Steps of 64 tokens cut the batch's prompts into chunks, and the solo runs find
        // their prompts' full blocks in the prefix cache: neither may change a token.
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 32,
            max_num_batched_tokens: 64,
            max_waiting: 4000,
            num_speculative_tokens: k,
            speculative_adaptive: async_scheduling && k > 0,
        },
        max_model_len: None,
        async_scheduling,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let drafter = drafter(backend.as_mut(), built);
    start_engine(backend, &engine, drafter).unwrap()
}

/// Every request of `reqs` together, then each alone, through a deterministic engine, with
/// decode graphs for every default size when `graphs`; the tokens of both runs.
async fn together_and_alone(
    dir: &Path,
    reqs: &[(Vec<u32>, SamplingParams)],
    graphs: bool,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let engine = gpu_engine(dir, true);
    if graphs {
        let sizes = CaptureSizes::for_max_num_seqs(32);
        engine.graphs.capture(Some(sizes)).await.unwrap();
    }
    let mut together = Vec::new();
    for (tokens, usage) in run_all(&engine.scheduler, reqs, MAX_TOKENS).await {
        assert_eq!(usage.completion_tokens, MAX_TOKENS);
        together.push(tokens);
    }
    let mut alone = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        let id = (100 + i) as u64;
        let (tokens, _, _) =
            collect(submit(&engine.scheduler, id, prompt, params, MAX_TOKENS).await).await;
        alone.push(tokens);
    }
    (together, alone)
}

#[test]
fn deterministic_gpu_engine_gives_each_request_the_same_tokens_alone_batched_and_through_graphs() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 21).write_hf(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let reqs = requests(1000, 24, 21);
        let (together, alone) = together_and_alone(dir.path(), &reqs, false).await;
        for i in 0..reqs.len() {
            assert_eq!(
                alone[i],
                together[i],
                "request {i}: alone vs among {}",
                reqs.len()
            );
        }
        // Through decode graphs, padded batches included: the same tokens again.
        let (graph_together, graph_alone) = together_and_alone(dir.path(), &reqs, true).await;
        assert_eq!(graph_together, together, "batched, graphs vs eager");
        assert_eq!(graph_alone, together, "alone, graphs vs eager");
    });
}

/// Async scheduling (each greedy decode step queuing the next on the device before its
/// tokens reach the host) keeps every token: greedy requests together, then each alone,
/// through a deterministic engine's decode graphs get the tokens they get without it, and
/// steps queued ahead give tokens only with it.
#[test]
fn async_scheduling_on_the_gpu_keeps_every_greedy_token() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 24).write_hf(dir.path());
    let reqs = greedy_requests(12, 24);
    // One thread: the scheduler task records into this thread's recorder.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    runtime.block_on(async {
        let mut runs = Vec::new();
        for on in [false, true] {
            let engine = gpu_engine_drafting(dir.path(), true, |_, built| built, 0, None, on);
            let sizes = CaptureSizes::for_max_num_seqs(32);
            engine.graphs.capture(Some(sizes)).await.unwrap();
            let mut tokens: Vec<Vec<u32>> = run_all(&engine.scheduler, &reqs, MAX_TOKENS)
                .await
                .into_iter()
                .map(|(tokens, _)| tokens)
                .collect();
            for (i, (prompt, params)) in reqs.iter().enumerate() {
                let rx = submit(
                    &engine.scheduler,
                    (100 + i) as u64,
                    prompt,
                    params,
                    MAX_TOKENS,
                );
                tokens.push(collect(rx.await).await.0);
            }
            let served = counter(
                &snapshotter.snapshot().into_vec(),
                "peregrine:decode_ahead_tokens_total",
            );
            assert_eq!(served > 0, on, "{served} tokens from steps queued ahead");
            engine.shutdown().await;
            runs.push(tokens);
        }
        assert_eq!(runs[0], runs[1], "async scheduling changed a token");
    });
}

/// Greedy requests whose prompts repeat a pattern (so that n-gram drafts are often right)
/// or are random.
fn greedy_requests(n: usize, seed: u64) -> Vec<(Vec<u32>, SamplingParams)> {
    requests(1000, n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, (prompt, _))| {
            let prompt = if i % 2 == 0 {
                prompt
                    .iter()
                    .copied()
                    .cycle()
                    .take(prompt.len() * 3)
                    .collect()
            } else {
                prompt
            };
            (prompt, SamplingParams::greedy())
        })
        .collect()
}

/// Under --deterministic a verification forward (K+1 rows a request) computes each row as
/// a one-row decode would, so speculation must not change a greedy token: n-gram drafts,
/// a draft model (the same weights) whose drafts are mostly accepted, on the CPU and on
/// the GPU beside the target, there eagerly and through its decode graphs, and a random
/// EAGLE-3 head on the GPU (sharing the target's embedding, reading the target's layer
/// inputs), eagerly and through its graphs, and drafting adaptively with the plain steps
/// between queued ahead. Graphs of a drafter give the drafts of its eager steps, so each
/// request accepts as many.
#[test]
fn speculation_on_the_gpu_keeps_every_greedy_token_under_deterministic() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 22).write_hf(dir.path());
    let reqs = greedy_requests(12, 22);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let plain = run_all(&gpu_engine(dir.path(), true).scheduler, &reqs, MAX_TOKENS).await;
        let k = 3;
        let mut accepted_on_gpu = Vec::new();
        let head_dir = dir.path().join("eagle3");
        let head_spec = HeadSpec {
            aux_ids: Some(vec![1, 0, 1]),
            ..gpu_head_spec(true, false)
        };
        let target_spec = gpu_sized(TinySpec::llama_tiny());
        RandomHead::new(&head_spec, &target_spec, 23).write(&head_dir);
        let methods = [
            "ngram",
            "draft_model",
            "gpu draft",
            "gpu draft graphs",
            "gpu eagle3",
            "gpu eagle3 graphs",
            "gpu eagle3 graphs ahead",
        ];
        for method in methods {
            // "draft_model": the draft model on the CPU over the GPU target's pool; the
            // others as the backend built them.
            let on_device = Arc::new(AtomicUsize::new(0));
            let drafter = |target: &mut dyn ModelBackend,
                           built: Option<Box<dyn DraftMethod>>|
             -> Option<Box<dyn DraftMethod>> {
                if method != "draft_model" {
                    let built = built.unwrap_or_else(|| panic!("{method}: no drafter built"));
                    let counted = CountingOnDevice {
                        inner: built,
                        on_device: on_device.clone(),
                    };
                    return Some(Box::new(counted));
                }
                assert!(built.is_none(), "draft_model: the backend built a drafter");
                let model = LlamaModel::load(dir.path()).unwrap();
                let draft = DraftModel::new(model, target.config(), target.pool());
                Some(Box::new(draft.unwrap()))
            };
            let spec = match method {
                "ngram" => Some(DraftSpec::Ngram { min: 1, max: 3 }),
                m if m.starts_with("gpu eagle3") => Some(DraftSpec::Eagle3Head(head_dir.clone())),
                m if m.starts_with("gpu") => Some(DraftSpec::Model(dir.path().to_path_buf())),
                _ => None,
            };
            // "ahead": drafting adaptively, the plain steps between queue their successors
            // and hand the head their hidden states from the decode graphs.
            let ahead = method.ends_with("ahead");
            let engine = gpu_engine_drafting(dir.path(), true, drafter, k, spec, ahead);
            if method.contains("graphs") {
                let sizes = CaptureSizes::for_max_num_seqs(32);
                engine.graphs.capture(Some(sizes)).await.unwrap();
            }
            let drafted = run_all(&engine.scheduler, &reqs, MAX_TOKENS).await;
            let (mut proposed, mut accepted) = (0, 0);
            for (i, ((want, _), (got, usage))) in plain.iter().zip(&drafted).enumerate() {
                assert_eq!(got, want, "{method}: request {i} changed with speculation");
                proposed += usage.num_draft_tokens;
                accepted += usage.num_accepted_tokens;
            }
            // The EAGLE-3 head's chains from graphs of step 0 leave their drafts on the
            // device, fed into the verification graphs there; nothing else does.
            let handed = on_device.swap(0, Ordering::Relaxed);
            eprintln!("{method}: {handed} drafts handed off on the device");
            if !ahead {
                assert_eq!(handed > 0, method == "gpu eagle3 graphs", "{method}");
            }
            if method == "gpu eagle3 graphs" {
                // Asking logprobs, each verification reads the drafts back first.
                for (i, (prompt, params)) in reqs.iter().enumerate() {
                    let spec = RequestSpec {
                        logprobs: Some(1),
                        ..request_spec(prompt, params, MAX_TOKENS)
                    };
                    let (got, ..) =
                        collect(served::submit(&engine.scheduler, 500 + i as u64, spec).await)
                            .await;
                    assert_eq!(got, plain[i].0, "{method}, logprobs: request {i}");
                }
                assert!(on_device.load(Ordering::Relaxed) > 0, "{method}, logprobs");
            }
            eprintln!("{method}: {accepted} of {proposed} drafts accepted");
            assert!(proposed > 0, "{method}: no draft was verified");
            // The draft model has the target's weights: most of its drafts are right.
            if method.contains("draft") {
                assert!(
                    accepted * 2 > proposed,
                    "{method}: {accepted} of {proposed}"
                );
            }
            if method.starts_with("gpu") && !ahead {
                let per_request: Vec<usize> =
                    drafted.iter().map(|(_, u)| u.num_accepted_tokens).collect();
                accepted_on_gpu.push(per_request);
            }
        }
        assert_eq!(
            accepted_on_gpu[0], accepted_on_gpu[1],
            "the GPU draft's graphs changed what its drafts were accepted"
        );
        assert_eq!(
            accepted_on_gpu[2], accepted_on_gpu[3],
            "the EAGLE-3 head's graphs changed what its drafts were accepted"
        );
    });
}

/// `--speculative-method mtp` on the GPU: DeepSeek-V3's tiny fixture with a random
/// multi-token prediction layer drafts K = 2 tokens a step for greedy requests, eagerly and
/// through the head's graphs (its draft steps and step 0) and the target's verification
/// graphs; every request's tokens are those it gets without speculation, and the graphs
/// change no acceptance.
#[test]
fn mtp_drafts_on_the_gpu_leave_greedy_outputs_unchanged() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    crate::common::mtp_checkpoint::write(dir.path(), 41);
    let reqs: Vec<_> = requests(320, 12, 42)
        .into_iter()
        .map(|(prompt, _)| (prompt, SamplingParams::greedy()))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let plain = run_all(&gpu_engine(dir.path(), false).scheduler, &reqs, MAX_TOKENS).await;
        let mut accepted_by_run = Vec::new();
        for graphs in [false, true] {
            let drafter = |_: &mut dyn ModelBackend, built: Option<Box<dyn DraftMethod>>| {
                assert!(built.is_some(), "the backend built no MTP drafter");
                built
            };
            let mtp = Some(DraftSpec::Mtp(dir.path().to_path_buf()));
            let engine = gpu_engine_drafting(dir.path(), false, drafter, 2, mtp, false);
            if graphs {
                let sizes = CaptureSizes::for_max_num_seqs(32);
                engine.graphs.capture(Some(sizes)).await.unwrap();
            }
            let drafted = run_all(&engine.scheduler, &reqs, MAX_TOKENS).await;
            let (mut proposed, mut accepted) = (0, 0);
            for (i, ((want, _), (got, usage))) in plain.iter().zip(&drafted).enumerate() {
                assert_eq!(
                    got, want,
                    "graphs {graphs}: request {i} changed with MTP drafts"
                );
                proposed += usage.num_draft_tokens;
                accepted += usage.num_accepted_tokens;
            }
            eprintln!("MTP, graphs {graphs}: {accepted} of {proposed} drafts accepted");
            assert!(proposed > 0, "graphs {graphs}: no draft was verified");
            accepted_by_run.push(
                drafted
                    .iter()
                    .map(|(_, u)| u.num_accepted_tokens)
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(
            accepted_by_run[0], accepted_by_run[1],
            "the MTP layer's graphs changed what its drafts were accepted"
        );
    });
}

/// The GPU twin of `sampled_eagle3_drafts_keep_the_target_distribution` (tests/eagle3.rs):
/// sampled requests draft from the GPU head's distribution (its draft logits all equal: q
/// = 1/32 on the ids the draft vocabulary maps first, the target's likely tokens among
/// them), through the head's graphs, and verify against it. The first two tokens keep the
/// target's distribution (its own, from the GPU model), by Pearson's chi-square, and the
/// drafts are accepted as often as sum_t min(p(t), q(t)) says, which a one-hot q would not
/// give.
#[test]
fn sampled_eagle3_drafts_on_the_gpu_keep_the_target_distribution() {
    if setup().is_none() {
        return;
    }
    const DRAWS: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    let target_spec = gpu_sized(TinySpec::llama_tiny());
    TinyModel::random(target_spec.clone(), 31).write_hf(dir.path());
    let prompt: Vec<u32> = vec![11, 12, 13, 11, 12, 13, 11, 12];
    let params = |seed: u64| SamplingParams {
        temperature: 0.7,
        top_k: 3,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let mut model = gpu_model(dir.path(), false);
    let sampler = peregrine_ops::sampling::Sampler::new(&params(0)).unwrap();
    let mut dist = |tokens: &[u32]| {
        let layers = model.config().num_layers;
        let layout = model.kv_layout(DIST_POOL_BLOCKS, DIST_BLOCK_SIZE as u64);
        let mut cache = GpuKvCache::new(model.gpu(), layers, layout).unwrap();
        let plan = one_sequence_plan(tokens.len());
        let last = [tokens.len() - 1];
        let logits = model
            .forward_to_host(tokens, &plan, &mut cache, &last)
            .unwrap();
        sampler.probabilities(&logits, &prompt, &tokens[prompt.len()..])
    };
    let (first, second) = first_two_distributions(&prompt, &mut dist);
    drop(model);
    let mut likely: Vec<u32> = first.iter().map(|&(t, _)| t).collect();
    likely.extend(second.iter().flatten().map(|&(t, _)| t));
    likely.sort_unstable();
    likely.dedup();
    let head_dir = dir.path().join("eagle3");
    let head_spec = HeadSpec {
        aux_ids: Some(vec![1, 0, 1]),
        ..gpu_head_spec(true, false)
    };
    let mut head = RandomHead::new(&head_spec, &target_spec, 32);
    let lm_head = head.tensors.get_mut("lm_head.weight").unwrap();
    lm_head.1.iter_mut().for_each(|w| *w = 0.0);
    let rest = (0..target_spec.vocab_size as u32).filter(|t| !likely.contains(t));
    let order: Vec<u32> = likely.iter().copied().chain(rest).collect();
    for (draft, offset) in head.d2t.iter_mut().enumerate() {
        *offset = i64::from(order[draft]) - draft as i64;
    }
    head.write(&head_dir);
    let drafter = |_: &mut dyn ModelBackend, built: Option<Box<dyn DraftMethod>>| {
        assert!(built.is_some(), "the backend built no EAGLE-3 drafter");
        built
    };
    let reqs: Vec<(Vec<u32>, SamplingParams)> = (0..DRAWS as u64)
        .map(|seed| (prompt.clone(), params(seed)))
        .collect();
    let gpu_draft = Some(DraftSpec::Eagle3Head(head_dir));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outs = runtime.block_on(async {
        let engine = gpu_engine_drafting(dir.path(), false, drafter, 3, gpu_draft, false);
        engine
            .graphs
            .capture(Some(CaptureSizes::for_max_num_seqs(32)))
            .await
            .unwrap();
        run_all(&engine.scheduler, &reqs, 3).await
    });
    assert_uniform_drafts_accepted(&outs, &first, &second, &order[..32]);
    assert_first_two_follow(&outs, &first, &second, "");
}

/// `kv_cache_memory` sizes the GPU pool (the bytes of so many blocks give that many), and a
/// value past what `gpu_memory_utilization` leaves is refused, named.
#[test]
fn kv_cache_memory_sizes_the_gpu_pool_and_more_than_fits_is_refused() {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 32).write_hf(dir.path());
    let settings = |kv_cache_memory| GpuSettings {
        kv_cache_memory,
        ..tiny_settings(false)
    };
    let pool = cuda_backend(dir.path(), &settings(None))
        .unwrap()
        .target
        .pool()
        .clone();
    let layers = TinySpec::llama_tiny().num_layers as u64;
    let block_bytes = pool.bytes_per_layer / pool.layout.num_blocks * layers;
    let sized = cuda_backend(dir.path(), &settings(Some(100 * block_bytes + 1)))
        .unwrap()
        .target
        .pool()
        .layout
        .num_blocks;
    assert_eq!(sized, 100);
    let past = pool.bytes_per_layer * layers * 4;
    let err = cuda_backend(dir.path(), &settings(Some(past)))
        .err()
        .expect("a pool past the device's share is refused")
        .to_string();
    assert!(
        err.contains("kv_cache_memory") && err.contains("gpu_memory_utilization"),
        "{err}"
    );
}

/// A drafter that counts the drafts `inner` leaves on the device.
struct CountingOnDevice {
    inner: Box<dyn DraftMethod>,
    on_device: Arc<AtomicUsize>,
}

impl DraftMethod for CountingOnDevice {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        let drafts = self.inner.propose(seqs)?;
        let placed: usize = drafts
            .iter()
            .map(|d| d.on_device.as_ref().map_or(0, Vec::len))
            .sum();
        self.on_device.fetch_add(placed, Ordering::Relaxed);
        Ok(drafts)
    }
    fn release(&mut self, id: RequestId) {
        self.inner.release(id)
    }
    fn hidden_layers(&self) -> Option<Vec<usize>> {
        self.inner.hidden_layers()
    }
    fn kv_bytes_per_block(&self) -> Option<u64> {
        self.inner.kv_bytes_per_block()
    }
    fn receive_hidden(&mut self, rows: Vec<HiddenRows>) {
        self.inner.receive_hidden(rows)
    }
    fn caught_up(&self) -> bool {
        self.inner.caught_up()
    }
    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.inner.capture_graphs(sizes)
    }
}
