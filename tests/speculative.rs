//! Speculative decoding through the serving engine: greedy outputs with drafts (n-gram, or
//! a draft model that agrees with the target or one that does not) equal the outputs
//! without, token for token, in mixed batches, under preemption and with prefix caching;
//! sampled outputs keep the target's distribution; and the acceptance alarms fire under a
//! draft-KV fault past a block id and stay quiet without it: the whole-pool alarm when
//! every request is past the fault, the band alarm when requests past block 65,535 accept
//! less than those below it.

mod common;

use common::engine::{collect, submit};
use common::first_two::{assert_first_two_follow, cpu_distribution, first_two_distributions};
use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use peregrine_actors::backend::{cpu_backend, ModelBackend};
use peregrine_actors::draft::{DraftMethod, DraftModel, Ngram};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{
    GenerateRequest, GeneratedToken, RequestEvent, RequestId, RequestSpec, SchedulerLimits,
    SchedulerMsg, Usage,
};
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::{Sampler, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tracing_subscriber::util::SubscriberInitExt;

const BLOCK: usize = 16;

/// How a run drafts.
#[derive(Clone, Copy)]
enum Method<'a> {
    Off,
    Ngram,
    /// A draft model, with the fault hook's block id threshold if any.
    Draft(&'a Path, Option<u32>),
}

struct Run<'a> {
    kv_blocks: u64,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    k: usize,
    method: Method<'a>,
}

impl Run<'_> {
    fn roomy(method: Method) -> Run {
        Run {
            kv_blocks: 128,
            max_num_seqs: 16,
            max_num_batched_tokens: 64,
            k: 3,
            method,
        }
    }

    /// Nine blocks for many requests of up to 4 blocks: preemption and recompute.
    fn tight(method: Method) -> Run {
        Run {
            kv_blocks: 9,
            max_num_seqs: 16,
            max_num_batched_tokens: 48,
            k: 3,
            method,
        }
    }
}

fn backend(dir: &Path, kv_blocks: u64) -> Box<dyn ModelBackend> {
    let spec = TinySpec::llama_tiny();
    let bytes_per_token = (2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4) as u64;
    cpu_backend(
        LlamaModel::load(dir).unwrap(),
        kv_blocks * BLOCK as u64 * bytes_per_token,
        BLOCK,
    )
    .unwrap()
}

/// Every request of `reqs` at once (or one after the other when `sequential`) through
/// the engine of the tiny model in `dir`; each one's tokens and usage.
async fn served(
    dir: &Path,
    reqs: &[(Vec<u32>, SamplingParams)],
    max_tokens: usize,
    run: &Run<'_>,
    sequential: bool,
) -> Vec<(Vec<u32>, Usage)> {
    let target = backend(dir, run.kv_blocks);
    let drafter: Option<Box<dyn DraftMethod>> = match run.method {
        Method::Off => None,
        Method::Ngram => Some(Box::new(Ngram::new(1, 3).unwrap())),
        Method::Draft(draft_dir, fault) => {
            let model = LlamaModel::load(draft_dir).unwrap();
            let draft = DraftModel::new(model, target.config(), target.pool()).unwrap();
            Some(Box::new(match fault {
                Some(block) => draft.with_kv_fault_above(block),
                None => draft,
            }))
        }
    };
    let settings = EngineSettings {
        block_size: BLOCK,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: run.max_num_seqs,
            max_num_batched_tokens: run.max_num_batched_tokens,
            max_waiting: 10_000,
            num_speculative_tokens: run.k,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, drafter).unwrap();
    let mut out = Vec::new();
    let mut streams = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        let rx = submit(&engine.scheduler, i as u64, prompt, params, max_tokens).await;
        if sequential {
            let (tokens, _, usage) = collect(rx).await;
            out.push((tokens, usage));
        } else {
            streams.push(rx);
        }
    }
    for rx in streams {
        let (tokens, _, usage) = collect(rx).await;
        assert_eq!(usage.completion_tokens, tokens.len());
        out.push((tokens, usage));
    }
    out
}

/// Requests that draft well and badly: prompts that repeat a short pattern (n-gram
/// lookups hit) and random ones, of 5 to 50 tokens; every third one sampled.
fn mixed_requests(n: usize, seed: u64) -> Vec<(Vec<u32>, SamplingParams)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = rng.random_range(5..50);
            let prompt: Vec<u32> = if i % 2 == 0 {
                let period: Vec<u32> = (0..rng.random_range(2..6))
                    .map(|_| rng.random_range(3..300))
                    .collect();
                (0..len).map(|j| period[j % period.len()]).collect()
            } else {
                (0..len).map(|_| rng.random_range(3..300)).collect()
            };
            let params = if i % 3 == 2 {
                SamplingParams {
                    temperature: 0.8,
                    seed: Some(i as u64),
                    ..SamplingParams::default()
                }
            } else {
                SamplingParams::greedy()
            };
            (prompt, params)
        })
        .collect()
}

type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

fn value(snapshot: &Snapshot, name: &str) -> f64 {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(.., v)| match v {
            DebugValue::Counter(c) => *c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(_) => 0.0,
        })
        .sum()
}

/// Takes snapshots of the recorder; counters restart from zero after each.
struct Meter(Snapshotter);

impl Meter {
    fn take(&self) -> Snapshot {
        self.0.snapshot().into_vec()
    }
}

fn assert_greedy_equal(
    reqs: &[(Vec<u32>, SamplingParams)],
    want: &[(Vec<u32>, Usage)],
    got: &[(Vec<u32>, Usage)],
    what: &str,
) {
    for (i, (req, (w, g))) in reqs.iter().zip(want.iter().zip(got)).enumerate() {
        assert_eq!(g.0.len(), w.0.len(), "request {i}, {what}: length");
        if req.1.is_greedy() {
            assert_eq!(g.0, w.0, "request {i}, {what}");
        }
    }
}

const MAX_TOKENS: usize = 24;

#[tokio::test]
async fn ngram_greedy_outputs_equal_no_speculation() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 91).write_hf(dir.path());
    let reqs = mixed_requests(14, 3);
    let recorder = DebuggingRecorder::new();
    let meter = Meter(recorder.snapshotter());
    let _guard = metrics::set_default_local_recorder(&recorder);

    let plain = served(
        dir.path(),
        &reqs,
        MAX_TOKENS,
        &Run::roomy(Method::Off),
        false,
    )
    .await;
    meter.take();
    let roomy = served(
        dir.path(),
        &reqs,
        MAX_TOKENS,
        &Run::roomy(Method::Ngram),
        false,
    )
    .await;
    let s = meter.take();
    assert_greedy_equal(&reqs, &plain, &roomy, "ngram, roomy pool");
    let drafts = value(&s, "peregrine:spec_decode_num_draft_tokens_total");
    let accepted = value(&s, "peregrine:spec_decode_num_accepted_tokens_total");
    assert!(drafts > 0.0, "no drafts");
    assert!(
        accepted > 0.0 && accepted < drafts,
        "accepted {accepted} of {drafts}"
    );

    let tight = served(
        dir.path(),
        &reqs,
        MAX_TOKENS,
        &Run::tight(Method::Ngram),
        false,
    )
    .await;
    let s = meter.take();
    assert_greedy_equal(&reqs, &plain, &tight, "ngram, tight pool");
    assert!(
        value(&s, "peregrine:num_preemptions_total") > 0.0,
        "no preemption"
    );
    assert!(value(&s, "peregrine:spec_decode_num_accepted_tokens_total") > 0.0);
}

#[tokio::test]
async fn draft_model_greedy_outputs_equal_no_speculation() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 92).write_hf(dir.path());
    TinyModel::random(TinySpec::llama_tiny(), 93).write_hf(other.path());
    let reqs = mixed_requests(12, 4);
    let recorder = DebuggingRecorder::new();
    let meter = Meter(recorder.snapshotter());
    let _guard = metrics::set_default_local_recorder(&recorder);
    let plain = served(
        dir.path(),
        &reqs,
        MAX_TOKENS,
        &Run::roomy(Method::Off),
        false,
    )
    .await;
    let mut rates = Vec::new();
    for draft in [dir.path(), other.path()] {
        for run in [
            Run::roomy(Method::Draft(draft, None)),
            Run::tight(Method::Draft(draft, None)),
        ] {
            meter.take();
            let got = served(dir.path(), &reqs, MAX_TOKENS, &run, false).await;
            let s = meter.take();
            assert_greedy_equal(&reqs, &plain, &got, "draft model");
            let drafts = value(&s, "peregrine:spec_decode_num_draft_tokens_total");
            let accepted = value(&s, "peregrine:spec_decode_num_accepted_tokens_total");
            let per_request: usize = got.iter().map(|(_, u)| u.num_accepted_tokens).sum();
            assert_eq!(
                per_request as f64, accepted,
                "usage agrees with the counters"
            );
            rates.push(accepted / drafts);
        }
    }
    // The target as its own draft agrees with every greedy request and with the sampled
    // ones where they draw the argmax (a third of the requests, which verify more often
    // as they accept less); a different random model almost never agrees.
    assert!(rates[0] > 0.3 && rates[1] > 0.3, "{rates:?}");
    assert!(rates[2] < 0.05 && rates[3] < 0.05, "{rates:?}");
}

#[tokio::test]
async fn prefix_cache_hits_with_speculation_keep_outputs() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 94).write_hf(dir.path());
    let prompt: Vec<u32> = (0..40).map(|i| [7, 8, 9, 10][i % 4]).collect();
    let reqs = vec![(prompt.clone(), SamplingParams::greedy()); 3];
    let plain = served(dir.path(), &reqs[..1], 30, &Run::roomy(Method::Off), false).await;
    for method in [Method::Ngram, Method::Draft(dir.path(), None)] {
        let runs = served(dir.path(), &reqs, 30, &Run::roomy(method), true).await;
        assert_eq!(runs[0].1.cached_tokens, 0);
        for run in &runs {
            assert_eq!(run.0, plain[0].0);
        }
        assert!(runs[1].1.cached_tokens >= 32, "{:?}", runs[1].1);
        assert!(runs[2].1.cached_tokens >= 32, "{:?}", runs[2].1);
    }
}

#[tokio::test]
async fn sampled_first_two_tokens_keep_the_target_distribution() {
    const DRAWS: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 95).write_hf(dir.path());
    let prompt: Vec<u32> = vec![11, 12, 13, 11, 12, 13, 11, 12];
    let params = |seed| SamplingParams {
        temperature: 0.7,
        top_k: 3,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    // The target's own distributions: p(t1 | prompt) and p(t2 | prompt, t1).
    let model = LlamaModel::load(dir.path()).unwrap();
    let sampler = Sampler::new(&params(0)).unwrap();
    let dist = |tokens: &[u32]| cpu_distribution(&model, &sampler, &prompt, tokens);
    let (first, second) = first_two_distributions(&prompt, dist);
    let reqs: Vec<_> = (0..DRAWS as u64)
        .map(|seed| (prompt.clone(), params(seed)))
        .collect();
    let recorder = DebuggingRecorder::new();
    let meter = Meter(recorder.snapshotter());
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut run = Run::roomy(Method::Draft(dir.path(), None));
    run.kv_blocks = 512;
    run.max_num_seqs = 64;
    run.max_num_batched_tokens = 1024;
    let outs = served(dir.path(), &reqs, 3, &run, false).await;
    let s = meter.take();
    let accepted = value(&s, "peregrine:spec_decode_num_accepted_tokens_total");
    let drafts = value(&s, "peregrine:spec_decode_num_drafts_total");
    assert!(drafts > 0.0, "no verification");
    assert!(
        accepted > 0.0 && accepted < drafts,
        "{accepted} of {drafts}: both paths"
    );
    assert_first_two_follow(&outs, &first, &second, "");
}

/// Blocks of one token each, so that block ids pass 65,535 after as many tokens.
const ONE_TOKEN: usize = 1;
/// Blocks of the alarm runs' pool past block 65,535.
const HIGH_BLOCKS: u64 = 4000;

/// Each band's (accepted, proposed) drafts at each position, from the band series.
type BandCounts = Vec<(String, Vec<(f64, f64)>)>;

/// What an alarm run left: its metrics, the band series of them, and its log.
struct AlarmRun {
    metrics: Snapshot,
    bands: BandCounts,
    log: String,
}

/// A log the engine writes into while its subscriber is the thread's default.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A pool of 65,536 + `HIGH_BLOCKS` one-token blocks, its draft's KV zeroed past `fault`.
/// First, prompts of 1,000 tokens with one output token climb through ids below 63,000
/// (no drafts); then requests of 20 prompt and 60 output tokens, 16 at a time, take the
/// never-used ids up to 65,535, then those past it, then the freed ones below it again,
/// so that for a long stretch the window holds requests of both bands. All are greedy:
/// the draft is the target itself, so without the fault nearly every draft is accepted.
///
/// (An earlier run put every request past the fault, at block 480 of 1,024: drafts fell
/// from 100/100/90% to 70/48/40% by position. To the whole pool that is what a change of
/// workload does, and 48.8% to 17% must stay quiet, so no rule on the whole can tell the
/// two apart. The fault's shape is requests past a limit accepting less than those before
/// it, in the same window: the band alarm's test.)
async fn alarm_run(fault: Option<u32>) -> AlarmRun {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 96).write_hf(dir.path());
    let spec = TinySpec::llama_tiny();
    let bytes_per_token = (2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4) as u64;
    let kv_bytes = (65_536 + HIGH_BLOCKS) * bytes_per_token;
    let target = cpu_backend(LlamaModel::load(dir.path()).unwrap(), kv_bytes, ONE_TOKEN).unwrap();
    let model = LlamaModel::load(dir.path()).unwrap();
    let draft = DraftModel::new(model, target.config(), target.pool()).unwrap();
    let draft = match fault {
        Some(block) => draft.with_kv_fault_above(block),
        None => draft,
    };
    let settings = EngineSettings {
        block_size: ONE_TOKEN,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 16,
            max_num_batched_tokens: 2048,
            max_waiting: 10_000,
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let recorder = DebuggingRecorder::new();
    let meter = Meter(recorder.snapshotter());
    let _guard = metrics::set_default_local_recorder(&recorder);
    let log = Log::default();
    let writer = log.clone();
    let _log_guard = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .set_default();
    let engine = start_engine(target, &settings, Some(Box::new(draft))).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let mut prompt =
        |len: usize| -> Vec<u32> { (0..len).map(|_| rng.random_range(3..300)).collect() };
    let greedy = SamplingParams::greedy();
    let mut climb = Vec::new();
    for id in 0..63 {
        climb.push(submit(&engine.scheduler, id, &prompt(1000), &greedy, 1).await);
    }
    for rx in climb {
        collect(rx).await;
    }
    let mut streams = Vec::new();
    for id in 100..280 {
        streams.push(submit(&engine.scheduler, id, &prompt(20), &greedy, 60).await);
    }
    for rx in streams {
        collect(rx).await;
    }
    let metrics = meter.take();
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    AlarmRun {
        bands: band_counts(&metrics),
        metrics,
        log,
    }
}

/// The band series of `s`, by band (in name order) and position.
fn band_counts(s: &Snapshot) -> BandCounts {
    let mut bands: BandCounts = Vec::new();
    for (key, _, _, v) in s {
        let accepted = match key.key().name() {
            "peregrine:spec_decode_band_accepted_tokens_total" => true,
            "peregrine:spec_decode_band_draft_tokens_total" => false,
            _ => continue,
        };
        let DebugValue::Counter(count) = v else {
            continue;
        };
        let label = |n: &str| {
            let mut labels = key.key().labels();
            labels.find(|l| l.key() == n).map(|l| l.value().to_string())
        };
        let (Some(band), Some(position)) = (label("band"), label("position")) else {
            panic!("a band series without its labels: {key:?}");
        };
        let position: usize = position.parse().unwrap();
        let at = match bands.iter().position(|b| b.0 == band) {
            Some(at) => at,
            None => {
                bands.push((band, Vec::new()));
                bands.len() - 1
            }
        };
        let counts = &mut bands[at].1;
        if counts.len() <= position {
            counts.resize(position + 1, (0.0, 0.0));
        }
        if accepted {
            counts[position].0 += *count as f64;
        } else {
            counts[position].1 += *count as f64;
        }
    }
    bands.sort_by(|a, b| a.0.cmp(&b.0));
    bands
}

#[tokio::test]
async fn the_acceptance_alarm_fires_past_a_faulty_block_id() {
    let AlarmRun {
        metrics: s,
        bands,
        log,
    } = alarm_run(Some(65_535)).await;
    println!("by band and position (accepted, proposed): {bands:?}");
    let names: Vec<&str> = bands.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(names, ["blocks 0-65535", "blocks 65536-69535"]);
    let gaps: Vec<f64> = (0..3)
        .map(|p| {
            let rate = |b: usize| bands[b].1[p].0 / bands[b].1[p].1;
            rate(0) - rate(1)
        })
        .collect();
    assert!(
        gaps.iter().all(|&g| g > 0.1),
        "the fault did not bite: {gaps:?}"
    );
    assert_eq!(value(&s, "peregrine:spec_decode_acceptance_alarm"), 1.0);
    assert_eq!(
        value(&s, "peregrine:spec_decode_acceptance_alarms_total"),
        1.0
    );
    // The warning names the positions, the band's block ids and the largest one in use.
    let warning = log
        .lines()
        .find(|l| l.contains("spec: draft acceptance depends on where the draft KV lives:"))
        .unwrap_or_else(|| panic!("no band warning in the log:\n{log}"));
    println!("{warning}");
    assert!(warning.contains("WARN"), "{warning}");
    for needle in [
        " position 1: blocks 65536-69535 (draft KV bytes [",
        "below block 65536, -",
        " points at equal lengths (",
        "% of the rate lost), z -",
        " by band blocks 0-65535 ",
        " largest KV block id in use ",
    ] {
        assert!(warning.contains(needle), "{needle:?} not in {warning}");
    }
}

#[tokio::test]
async fn the_acceptance_alarm_stays_quiet_without_the_fault() {
    // The same requests through the same block ids as with the fault.
    let AlarmRun {
        metrics: s,
        bands,
        log,
    } = alarm_run(None).await;
    println!("by band and position (accepted, proposed): {bands:?}");
    assert_eq!(bands.len(), 2, "{bands:?}");
    assert!(
        bands.iter().all(|b| b.1.iter().all(|&(_, n)| n > 300.0)),
        "{bands:?}"
    );
    assert_eq!(
        value(&s, "peregrine:spec_decode_acceptance_alarms_total"),
        0.0
    );
    assert_eq!(value(&s, "peregrine:spec_decode_acceptance_alarm"), 0.0);
    assert!(!log.contains("spec: draft acceptance"), "{log}");
}

/// A draft model states the bytes one block takes in a layer's K (or V) tensor of its
/// cache, for the acceptance alarm's byte-offset bands; n-gram drafting keeps no KV.
#[test]
fn draft_methods_state_their_kv_bytes_per_block() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 98).write_hf(dir.path());
    let target = backend(dir.path(), 64);
    let model = LlamaModel::load(dir.path()).unwrap();
    let draft = DraftModel::new(model, target.config(), target.pool()).unwrap();
    let cache = draft.cache();
    let per_tensor = cache.bytes_per_layer() / 2;
    assert_eq!(
        draft.kv_bytes_per_block(),
        Some(per_tensor / cache.layout().num_blocks)
    );
    assert_eq!(Ngram::new(1, 3).unwrap().kv_bytes_per_block(), None);
}

#[tokio::test]
async fn a_reloaded_num_speculative_tokens_bounds_the_drafts() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 97).write_hf(dir.path());
    let target = backend(dir.path(), 64);
    let model = LlamaModel::load(dir.path()).unwrap();
    let draft = DraftModel::new(model, target.config(), target.pool()).unwrap();
    let limits = SchedulerLimits {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        max_waiting: 100,
        num_speculative_tokens: 3,
        speculative_adaptive: false,
    };
    let settings = EngineSettings {
        block_size: BLOCK,
        prefix_caching: true,
        limits,
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, Some(Box::new(draft))).unwrap();
    let recorder = DebuggingRecorder::new();
    let meter = Meter(recorder.snapshotter());
    let _guard = metrics::set_default_local_recorder(&recorder);
    let prompt: Vec<u32> = (3..23).collect();
    let greedy = SamplingParams::greedy();
    let mut per_verification = Vec::new();
    for (i, k) in [(0, 3), (1, 1), (2, 2)] {
        let (reply, done) = tokio::sync::oneshot::channel();
        let limits = SchedulerLimits {
            num_speculative_tokens: k,
            speculative_adaptive: false,
            ..limits
        };
        engine
            .scheduler
            .send(peregrine_actors::messages::SchedulerMsg::Reconfigure(
                limits, reply,
            ))
            .await
            .unwrap();
        done.await.unwrap();
        meter.take();
        let rx = submit(&engine.scheduler, i, &prompt, &greedy, 25).await;
        collect(rx).await;
        let s = meter.take();
        let drafts = value(&s, "peregrine:spec_decode_num_drafts_total");
        let tokens = value(&s, "peregrine:spec_decode_num_draft_tokens_total");
        per_verification.push(tokens / drafts);
    }
    // The target as its own draft: every verification gets all k drafts, except where
    // max_tokens leaves room for fewer at the end.
    assert!(
        (per_verification[0] - 3.0).abs() < 0.5,
        "{per_verification:?}"
    );
    assert_eq!(per_verification[1], 1.0, "{per_verification:?}");
    assert!(
        (per_verification[2] - 2.0).abs() < 0.3,
        "{per_verification:?}"
    );
}

/// One greedy request with `top` logprobs through an engine of the tiny model in `dir`;
/// its tokens with their logprobs.
async fn with_logprobs(
    dir: &Path,
    drafter: Option<Box<dyn DraftMethod>>,
    prompt: &[u32],
) -> Vec<GeneratedToken> {
    let settings = EngineSettings {
        block_size: BLOCK,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
            max_waiting: 10,
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(backend(dir, 64), &settings, drafter).unwrap();
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let request = GenerateRequest {
        id: RequestId(1),
        spec: RequestSpec {
            prompt: Arc::from(prompt),
            params: SamplingParams::greedy(),
            max_tokens: 20,
            stop_token_ids: vec![],
            ignore_eos: true,
            logprobs: Some(3),
            prompt_logprobs: None,
            priority: 0,
            grammar: None,
        },
        arrival: Instant::now(),
        events,
    };
    let (reply, queued) = tokio::sync::oneshot::channel();
    engine
        .scheduler
        .send(SchedulerMsg::Submit(request, reply))
        .await
        .unwrap();
    queued.await.unwrap().unwrap();
    let mut tokens = Vec::new();
    while let Some(RequestEvent::Tokens(t)) = rx.recv().await {
        tokens.extend(t);
    }
    tokens
}

#[tokio::test]
async fn logprobs_of_accepted_drafts_equal_those_without_speculation() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 98).write_hf(dir.path());
    let prompt: Vec<u32> = (0..30).map(|i| [40, 41, 42, 43, 44][i % 5]).collect();
    let plain = with_logprobs(dir.path(), None, &prompt).await;
    let target = backend(dir.path(), 64);
    let draft = DraftModel::new(
        LlamaModel::load(dir.path()).unwrap(),
        target.config(),
        target.pool(),
    )
    .unwrap();
    let spec = with_logprobs(dir.path(), Some(Box::new(draft)), &prompt).await;
    assert_eq!(plain.len(), 20);
    assert!(plain.iter().all(|t| t.logprobs.is_some()));
    assert_eq!(spec, plain, "tokens and logprobs, bit for bit");
}
