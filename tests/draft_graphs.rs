//! The draft model's decode graphs: its steps after the first replay graphs captured for
//! the target's sizes, padded up to a captured size, and draft exactly what the eager
//! draft model drafts, at exact, padded and oversized batches; the padded rows write draft
//! KV into the target pool's scratch block and nowhere else; through the engine, greedy
//! outputs with speculation over graphs equal those without, and a reload that changes the
//! sizes recaptures the draft's graphs without losing a request.

mod common;

use common::draft_rounds::{
    self, accept, assert_kv_only_where_owned, assert_same_drafts, pads, proposal, tokens_of,
    BATCHES, BLOCK, POOL_BLOCKS,
};
use common::engine::{collect, requests, run_all, solo, submit, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::backend::PoolInfo;
use peregrine_actors::draft::{DraftMethod, DraftModel};
use peregrine_actors::engine::{start_engine, Engine, EngineSettings};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{
    Drafted, FinishReason, ProposeSeq, RequestId, SchedulerLimits, SchedulerMsg,
};
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::SamplingParams;
use peregrine_ops::KvCache;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The tiny Llama, written to a fresh directory.
fn tiny_dir(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
    dir
}

/// The target pool the draft's cache mirrors: 64 blocks of 16 tokens and a scratch block.
fn target_pool(dir: &Path) -> PoolInfo {
    tiny_backend(dir, POOL_BLOCKS).pool().clone()
}

/// The tiny model in `dir` as a draft over `pool`, with graphs for `sizes` if any, and the
/// KV fault hook past block `fault` if any.
fn draft(
    dir: &Path,
    pool: &PoolInfo,
    sizes: Option<&CaptureSizes>,
    fault: Option<u32>,
) -> DraftModel {
    let model = LlamaModel::load(dir).unwrap();
    let config = model.config().clone();
    let mut draft = DraftModel::new(model, &config, pool).unwrap();
    if let Some(block) = fault {
        draft = draft.with_kv_fault_above(block);
    }
    draft.capture_graphs(sizes).unwrap();
    draft
}

/// The bits of block `block` in every layer of the draft's `cache`, K then V.
fn block_bits(cache: &KvCache, block: usize) -> Vec<u32> {
    draft_rounds::block_bits(cache, TinySpec::llama_tiny().num_layers, block)
}

/// One round of proposals to the eager draft model and to the one with graphs.
struct Round<'a> {
    n: usize,
    round: usize,
    seqs: &'a [ProposeSeq],
    eager: &'a DraftModel,
    graphs: &'a DraftModel,
    eager_drafts: Vec<Vec<u32>>,
    graph_drafts: Vec<Vec<u32>>,
    /// Whether a step of the round padded its batch.
    padded: bool,
    /// The graph model's scratch block before the round.
    scratch_before: Vec<u32>,
}

/// Three rounds of proposals for `n` sequences of prompts of 3 to 36 tokens, each round
/// accepting a different number of each sequence's drafts plus a token of its own, to an
/// eager draft model and to one replaying graphs of sizes 1, 2, 4 and 8, both with the KV
/// fault past block `fault` if any; `check` sees every round.
fn rounds(n: usize, fault: Option<u32>, mut check: impl FnMut(&Round)) {
    let dir = tiny_dir(61);
    let pool = target_pool(dir.path());
    let scratch = pool.scratch_block.unwrap() as usize;
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 16).unwrap();
    let mut eager = draft(dir.path(), &pool, None, fault);
    let mut graphs = draft(dir.path(), &pool, Some(&sizes), fault);
    let mut tokens: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = 3 + (i * 7) % 34;
            (0..len)
                .map(|t| (3 + (i * 13 + t * 5) % 290) as u32)
                .collect()
        })
        .collect();
    for round in 0..3 {
        let seqs = proposal(&tokens);
        let scratch_before = block_bits(graphs.cache(), scratch);
        let eager_drafts = tokens_of(eager.propose(&seqs).unwrap());
        let graph_drafts = tokens_of(graphs.propose(&seqs).unwrap());
        check(&Round {
            n,
            round,
            seqs: &seqs,
            eager: &eager,
            graphs: &graphs,
            eager_drafts: eager_drafts.clone(),
            graph_drafts,
            padded: pads(n, &sizes),
            scratch_before,
        });
        accept(&mut tokens, &eager_drafts, round);
    }
}

#[test]
fn graph_drafts_equal_eager_drafts_at_exact_padded_and_oversized_batches() {
    let mut padded_rounds = 0;
    for n in BATCHES {
        rounds(n, None, |r| {
            assert_same_drafts(
                r.n,
                r.round,
                &r.graph_drafts,
                &r.eager_drafts,
                r.graphs.cache(),
                TinySpec::llama_tiny().num_layers,
                &r.scratch_before,
                r.padded,
            );
            padded_rounds += usize::from(r.padded);
        });
    }
    assert!(padded_rounds >= 12, "{padded_rounds} padded rounds");
}

#[test]
fn padded_draft_steps_write_no_kv_outside_the_sequences_slots_but_the_scratch_block() {
    for n in BATCHES {
        rounds(n, None, |r| {
            let (graphs, eager) = (r.graphs.cache(), r.eager.cache());
            assert_kv_only_where_owned(
                r.n,
                r.round,
                graphs,
                eager,
                TinySpec::llama_tiny().num_layers,
            );
        });
    }
}

#[test]
fn the_kv_fault_hook_zeroes_the_same_draft_kv_eagerly_and_through_graphs() {
    // Sequences' third and fourth blocks lie past block 21: the longer sequences reach
    // them.
    const FAULT: u32 = 21;
    let mut faulted = 0;
    for n in BATCHES {
        rounds(n, Some(FAULT), |r| {
            let at = format!("batch {}, round {}", r.n, r.round);
            assert_eq!(r.graph_drafts, r.eager_drafts, "{at}");
            let scratch = r.graphs.cache().layout().num_blocks as usize - 1;
            for block in 0..scratch {
                let (got, want) = (
                    block_bits(r.graphs.cache(), block),
                    block_bits(r.eager.cache(), block),
                );
                assert!(got == want, "{at}: block {block} differs from eager");
                let used = r
                    .seqs
                    .iter()
                    .any(|s| s.block_table.contains(&(block as u32)));
                if used && block > FAULT as usize {
                    faulted += 1;
                    assert!(
                        got.iter().all(|&b| b == 0),
                        "{at}: block {block} not zeroed"
                    );
                }
            }
        });
    }
    assert!(faulted > 0, "no sequence reached a faulty block");
}

/// What a watched draft model saw.
#[derive(Default)]
struct Seen {
    /// The sizes of every capture asked of it, in order.
    captures: Vec<Option<Vec<usize>>>,
    /// Proposals that wrote its scratch block (a padded graph replay).
    scratch_writes: usize,
}

/// A draft model that reports what it does, and refuses to capture the sizes `refuse`.
struct Watched {
    draft: DraftModel,
    refuse: Option<Vec<usize>>,
    seen: Arc<Mutex<Seen>>,
}

impl Watched {
    fn scratch(&self) -> Vec<u32> {
        let cache = self.draft.cache();
        block_bits(cache, cache.layout().num_blocks as usize - 1)
    }
}

impl DraftMethod for Watched {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        let before = self.scratch();
        let drafts = self.draft.propose(seqs)?;
        if self.scratch() != before {
            self.seen.lock().unwrap().scratch_writes += 1;
        }
        Ok(drafts)
    }

    fn release(&mut self, id: RequestId) {
        self.draft.release(id);
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let list = sizes.map(|s| s.sizes().to_vec());
        self.seen.lock().unwrap().captures.push(list.clone());
        if list.is_some() && list == self.refuse {
            anyhow::bail!("refused by the test");
        }
        self.draft.capture_graphs(sizes)
    }
}

/// An engine of the tiny model in `dir` (pool of 64 blocks), verifying up to 3 drafts a
/// step of the same model as a draft watched by `seen` when given, which refuses to
/// capture the sizes `refuse`.
fn engine(
    dir: &Path,
    max_num_seqs: usize,
    seen: Option<&Arc<Mutex<Seen>>>,
    refuse: Option<Vec<usize>>,
) -> Engine {
    let target = tiny_backend(dir, POOL_BLOCKS);
    let drafter = seen.map(|seen| {
        let model = LlamaModel::load(dir).unwrap();
        let draft = DraftModel::new(model, target.config(), target.pool()).unwrap();
        Box::new(Watched {
            draft,
            refuse,
            seen: seen.clone(),
        }) as Box<dyn DraftMethod>
    });
    let settings = EngineSettings {
        block_size: BLOCK,
        prefix_caching: true,
        limits: limits(max_num_seqs),
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    start_engine(target, &settings, drafter).unwrap()
}

fn limits(max_num_seqs: usize) -> SchedulerLimits {
    SchedulerLimits {
        max_num_seqs,
        max_num_batched_tokens: 64,
        max_waiting: 100,
        num_speculative_tokens: 3,
        speculative_adaptive: false,
    }
}

/// `n` greedy requests of random prompts of 5 to 44 tokens.
fn greedy_requests(n: usize, seed: u64) -> Vec<(Vec<u32>, SamplingParams)> {
    requests(300, n, seed)
        .into_iter()
        .map(|(prompt, _)| (prompt, SamplingParams::greedy()))
        .collect()
}

#[tokio::test]
async fn greedy_outputs_with_draft_graphs_equal_those_without_speculation() {
    const MAX_TOKENS: usize = 24;
    let dir = tiny_dir(62);
    let reqs = greedy_requests(12, 5);
    let plain = run_all(
        &engine(dir.path(), 12, None, None).scheduler,
        &reqs,
        MAX_TOKENS,
    )
    .await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let drafting = engine(dir.path(), 12, Some(&seen), None);
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 12).unwrap();
    drafting.graphs.capture(Some(sizes)).await.unwrap();
    let drafted = run_all(&drafting.scheduler, &reqs, MAX_TOKENS).await;
    let (mut proposed, mut accepted) = (0, 0);
    for (i, ((want, _), (got, usage))) in plain.iter().zip(&drafted).enumerate() {
        assert_eq!(got, want, "request {i}");
        proposed += usage.num_draft_tokens;
        accepted += usage.num_accepted_tokens;
    }
    // The target is its own draft, and replayed graphs compute what the eager forward
    // does: every draft is the target's own greedy token.
    assert!(proposed > 0, "no draft verified");
    assert_eq!(accepted, proposed, "drafts rejected");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.captures, [Some(vec![1, 2, 4, 8])]);
    assert!(seen.scratch_writes > 0, "no padded draft step replayed");
}

/// What a reload of `max_num_seqs` does to the engine: capture `sizes`, then apply the
/// scheduler's new limits.
async fn reload(engine: &Engine, max_num_seqs: usize, sizes: &CaptureSizes) {
    engine.graphs.capture(Some(sizes.clone())).await.unwrap();
    let (reply, applied) = oneshot::channel();
    let msg = SchedulerMsg::Reconfigure(limits(max_num_seqs), reply);
    engine.scheduler.send(msg).await.unwrap();
    applied.await.unwrap();
}

#[tokio::test]
async fn a_reload_of_the_sizes_recaptures_the_draft_graphs_and_loses_no_request() {
    const MAX_TOKENS: usize = 16;
    let dir = tiny_dir(63);
    let reqs = greedy_requests(12, 9);
    let alone = solo(dir.path(), &reqs, MAX_TOKENS);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let refused = CaptureSizes::from_list(&[1, 3], 24).unwrap();
    let engine = engine(dir.path(), 16, Some(&seen), Some(refused.sizes().to_vec()));
    let first = CaptureSizes::for_max_num_seqs(16);
    engine.graphs.capture(Some(first.clone())).await.unwrap();
    let mut streams = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        streams.push(submit(&engine.scheduler, i as u64, prompt, params, MAX_TOKENS).await);
    }
    // Once the first tokens are out, reload max_num_seqs 16 -> 6; a capture the draft
    // refuses is refused as a whole; then 24.
    let first_event = streams[0].recv().await.expect("a first event");
    let (six, twenty_four) = (
        CaptureSizes::for_max_num_seqs(6),
        CaptureSizes::for_max_num_seqs(24),
    );
    reload(&engine, 6, &six).await;
    let err = engine.graphs.capture(Some(refused.clone())).await;
    let err = format!("{:#}", err.unwrap_err());
    assert!(
        err.contains("the draft's graphs: refused by the test"),
        "{err}"
    );
    reload(&engine, 24, &twenty_four).await;
    let mut outputs = Vec::new();
    for rx in streams {
        outputs.push(collect(rx).await);
    }
    let peregrine_actors::messages::RequestEvent::Tokens(first_tokens) = first_event else {
        panic!("the first event was not tokens");
    };
    let mut head: Vec<u32> = first_tokens.iter().map(|t| t.id).collect();
    head.extend(&outputs[0].0);
    outputs[0].0 = head;
    for (i, (tokens, reason, usage)) in outputs.iter().enumerate() {
        assert_eq!(*reason, FinishReason::Length, "request {i}");
        assert_eq!(usage.completion_tokens, MAX_TOKENS, "request {i}");
        assert_eq!(tokens, &alone[i], "request {i}");
        // The target is its own draft: every draft it verified was its own token.
        assert_eq!(
            usage.num_accepted_tokens, usage.num_draft_tokens,
            "request {i}"
        );
    }
    let captured: Vec<Option<Vec<usize>>> = [first, six, refused, twenty_four]
        .iter()
        .map(|s| Some(s.sizes().to_vec()))
        .collect();
    assert_eq!(seen.lock().unwrap().captures, captured);
    // The recaptured graphs serve the next requests: their padded steps replay.
    let writes = seen.lock().unwrap().scratch_writes;
    let again = run_all(&engine.scheduler, &reqs, MAX_TOKENS).await;
    for (i, (tokens, usage)) in again.iter().enumerate() {
        assert_eq!(tokens, &alone[i], "request {i}, after the reloads");
        let accepted = usage.num_accepted_tokens;
        assert_eq!(
            accepted, usage.num_draft_tokens,
            "request {i}, after the reloads"
        );
    }
    assert!(
        seen.lock().unwrap().scratch_writes > writes,
        "no padded replay"
    );
}
