//! An EAGLE-3 head's decode graphs: its draft steps after the first (one row per request,
//! fed the head's own previous `pre`) replay graphs captured for the target's sizes,
//! padded up to a captured size, and draft exactly what the eager head drafts, at exact,
//! padded and oversized batches; the padded rows write head KV into the target pool's
//! scratch block and nowhere else; through the engine, greedy outputs with EAGLE-3 over
//! graphs equal those without speculation, and each request's drafts are accepted exactly
//! as often as with the eager head.

mod common;

use common::draft_rounds::{
    self, accept, assert_kv_only_where_owned, assert_same_drafts, pads, proposal, tokens_of,
    BATCHES, BLOCK, POOL_BLOCKS,
};
use common::eagle3_head::{HeadSpec, RandomHead};
use common::engine::run_all;
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::backend::{cpu_backend, ModelBackend};
use peregrine_actors::draft::{DraftMethod, Eagle3};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_actors::messages::{
    Drafted, HiddenData, HiddenRows, ProposeSeq, RequestId, SchedulerLimits, Usage,
};
use peregrine_models::eagle3::Eagle3Head;
use peregrine_models::LlamaModel;
use peregrine_ops::sampling::SamplingParams;
use peregrine_ops::KvCache;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::{Arc, Mutex};

const TARGET_LAYERS: usize = 4;

/// A tiny random target and a random EAGLE-3 head for it (its q and k scaled up, so that
/// its attention is sharp and a wrong KV row changes the drafts), written to a fresh
/// directory as `target` and `head`.
fn write_models(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec {
        num_layers: TARGET_LAYERS,
        ..TinySpec::llama_tiny()
    };
    let target = TinyModel::random(spec, seed);
    target.write_hf(&dir.path().join("target"));
    RandomHead::new(&HeadSpec::midlayer(), &target.spec, seed + 1)
        .sharpened()
        .write(&dir.path().join("head"));
    dir
}

/// The target of `dir` on the CPU with a pool of 64 blocks of 16 tokens and a scratch
/// block.
fn target_backend(dir: &Path) -> Box<dyn ModelBackend> {
    let model = LlamaModel::load(&dir.join("target")).unwrap();
    let memory = POOL_BLOCKS * BLOCK as u64 * model.kv_bytes_per_token();
    cpu_backend(model, memory, BLOCK).unwrap()
}

/// The head of `dir` drafting for `target`, with graphs for `sizes` if any.
fn eagle3(dir: &Path, target: &dyn ModelBackend, sizes: Option<&CaptureSizes>) -> Eagle3 {
    let model = LlamaModel::load(&dir.join("target")).unwrap();
    let head = Eagle3Head::load(&dir.join("head"), &model).unwrap();
    let mut method = Eagle3::new(head, target.config(), target.pool()).unwrap();
    method.capture_graphs(sizes).unwrap();
    method
}

/// The bits of block `block` of the head's one-layer `cache`, K then V.
fn block_bits(cache: &KvCache, block: usize) -> Vec<u32> {
    draft_rounds::block_bits(cache, 1, block)
}

/// The target features of sequence `i` at positions `from..to`: random rows of `width`,
/// the same for every call.
fn features(i: usize, from: usize, to: usize, width: usize) -> Vec<f32> {
    (from..to)
        .flat_map(|pos| {
            let mut rng = ChaCha8Rng::seed_from_u64((i * 1000 + pos) as u64);
            (0..width)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One round of proposals to the eager head and to the one with graphs.
struct Round<'a> {
    n: usize,
    round: usize,
    eager: &'a Eagle3,
    graphs: &'a Eagle3,
    eager_drafts: Vec<Vec<u32>>,
    graph_drafts: Vec<Vec<u32>>,
    /// Whether a step of the round padded its batch.
    padded: bool,
    /// The graph head's scratch block before the round.
    scratch_before: Vec<u32>,
}

/// Three rounds of proposals for `n` sequences of prompts of 3 to 36 tokens, each round
/// accepting a different number of each sequence's drafts plus a token of its own, to an
/// eager head and to one replaying graphs of sizes 1, 2, 4 and 8, both given the same
/// target features; `check` sees every round.
fn rounds(n: usize, mut check: impl FnMut(&Round)) {
    let dir = write_models(81);
    let target = target_backend(dir.path());
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 16).unwrap();
    let mut eager = eagle3(dir.path(), target.as_ref(), None);
    let mut graphs = eagle3(dir.path(), target.as_ref(), Some(&sizes));
    let scratch = target.pool().scratch_block.unwrap() as usize;
    let width = eager.hidden_layers().unwrap().len() * target.config().hidden_size;
    let mut tokens: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = 3 + (i * 7) % 34;
            (0..len)
                .map(|t| (3 + (i * 13 + t * 5) % 290) as u32)
                .collect()
        })
        .collect();
    // Positions whose target features the heads have been given.
    let mut fed = vec![0; n];
    for round in 0..3 {
        let hidden = |fed: &[usize]| -> Vec<HiddenRows> {
            (0..n)
                .map(|i| HiddenRows {
                    id: RequestId(i as u64),
                    first_pos: fed[i],
                    data: HiddenData::Host(features(i, fed[i], tokens[i].len() - 1, width)),
                })
                .collect()
        };
        eager.receive_hidden(hidden(&fed));
        graphs.receive_hidden(hidden(&fed));
        let seqs = proposal(&tokens);
        let scratch_before = block_bits(graphs.cache(), scratch);
        let eager_drafts = tokens_of(eager.propose(&seqs).unwrap());
        let graph_drafts = tokens_of(graphs.propose(&seqs).unwrap());
        check(&Round {
            n,
            round,
            eager: &eager,
            graphs: &graphs,
            eager_drafts: eager_drafts.clone(),
            graph_drafts,
            padded: pads(n, &sizes),
            scratch_before,
        });
        for (f, t) in fed.iter_mut().zip(&tokens) {
            *f = t.len() - 1;
        }
        accept(&mut tokens, &eager_drafts, round);
    }
}

#[test]
fn head_graph_drafts_equal_eager_drafts_at_exact_padded_and_oversized_batches() {
    let mut padded_rounds = 0;
    for n in BATCHES {
        rounds(n, |r| {
            assert_same_drafts(
                r.n,
                r.round,
                &r.graph_drafts,
                &r.eager_drafts,
                r.graphs.cache(),
                1,
                &r.scratch_before,
                r.padded,
            );
            padded_rounds += usize::from(r.padded);
        });
    }
    assert!(padded_rounds >= 12, "{padded_rounds} padded rounds");
}

#[test]
fn padded_head_steps_write_no_kv_outside_the_sequences_slots_but_the_scratch_block() {
    for n in BATCHES {
        rounds(n, |r| {
            let (graphs, eager) = (r.graphs.cache(), r.eager.cache());
            assert_kv_only_where_owned(r.n, r.round, graphs, eager, 1);
        });
    }
}

/// What a watched head saw in the engine.
#[derive(Default)]
struct Seen {
    /// Proposals that drafted.
    proposals: usize,
    /// Proposals whose drafts differed from those of the eager twin.
    mismatches: usize,
    /// Proposals that wrote the scratch block (a padded graph replay).
    scratch_writes: usize,
}

/// A head with graphs (once the engine captures them) beside an eager twin fed the same
/// features and proposals: it proposes its own drafts and counts those that differ from
/// the twin's.
struct Watched {
    method: Eagle3,
    eager: Eagle3,
    seen: Arc<Mutex<Seen>>,
}

impl Watched {
    fn scratch(&self) -> Vec<u32> {
        let cache = self.method.cache();
        block_bits(cache, cache.layout().num_blocks as usize - 1)
    }
}

impl DraftMethod for Watched {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        let before = self.scratch();
        let drafts = self.method.propose(seqs)?;
        let want = self.eager.propose(seqs)?;
        let mut seen = self.seen.lock().unwrap();
        seen.proposals += usize::from(drafts.iter().any(|d| !d.tokens.is_empty()));
        seen.mismatches += usize::from(drafts != want);
        seen.scratch_writes += usize::from(self.scratch() != before);
        Ok(drafts)
    }

    fn release(&mut self, id: RequestId) {
        self.method.release(id);
        self.eager.release(id);
    }

    fn hidden_layers(&self) -> Option<Vec<usize>> {
        self.method.hidden_layers()
    }

    fn receive_hidden(&mut self, rows: Vec<HiddenRows>) {
        self.eager.receive_hidden(rows.clone());
        self.method.receive_hidden(rows);
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.method.capture_graphs(sizes)
    }
}

/// Every prompt through the engine of `dir`'s target, greedy, drafting up to 3 tokens a
/// step with its head watched by `seen` when given, over graphs of sizes 1, 2, 4 and 8;
/// each one's tokens and usage.
async fn served(
    dir: &Path,
    seen: Option<&Arc<Mutex<Seen>>>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<(Vec<u32>, Usage)> {
    let target = target_backend(dir);
    let drafter = seen.map(|seen| {
        Box::new(Watched {
            method: eagle3(dir, target.as_ref(), None),
            eager: eagle3(dir, target.as_ref(), None),
            seen: seen.clone(),
        }) as Box<dyn DraftMethod>
    });
    let settings = EngineSettings {
        block_size: BLOCK,
        prefix_caching: false,
        limits: SchedulerLimits {
            max_num_seqs: 12,
            max_num_batched_tokens: 64,
            max_waiting: 100,
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, drafter).unwrap();
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 12).unwrap();
    engine.graphs.capture(Some(sizes)).await.unwrap();
    let reqs: Vec<_> = prompts
        .iter()
        .map(|p| (p.clone(), SamplingParams::greedy()))
        .collect();
    run_all(&engine.scheduler, &reqs, max_tokens).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_outputs_with_eagle3_graphs_equal_those_without_speculation() {
    const MAX_TOKENS: usize = 24;
    let dir = write_models(91);
    let mut rng = ChaCha8Rng::seed_from_u64(92);
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|_| {
            let len = rng.random_range(3..45);
            (0..len).map(|_| rng.random_range(0..300)).collect()
        })
        .collect();
    let plain = served(dir.path(), None, &prompts, MAX_TOKENS).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let drafted = served(dir.path(), Some(&seen), &prompts, MAX_TOKENS).await;
    let mut proposed = 0;
    for (i, ((want, _), (got, usage))) in plain.iter().zip(&drafted).enumerate() {
        assert_eq!(got, want, "request {i}");
        proposed += usage.num_draft_tokens;
    }
    assert!(proposed > 0, "no draft verified");
    let seen = seen.lock().unwrap();
    assert!(seen.proposals > 0, "no proposal drafted");
    assert_eq!(
        seen.mismatches, 0,
        "drafts over graphs differed from eager drafts"
    );
    assert!(seen.scratch_writes > 0, "no padded head step replayed");
}
