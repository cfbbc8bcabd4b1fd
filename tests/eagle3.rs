//! EAGLE-3 drafting on the CPU (the head itself against a float64 reference:
//! `models/tests/eagle3_head.rs`). Through the serving engine, greedy outputs with EAGLE-3
//! drafts equal those without speculation, token for token, and sampled drafts keep the
//! target's distribution. The proposer drafts what the head run afresh over the verified
//! history gives, across prompt chunks, requests planned without drafts and prefix hits;
//! its KV fault hook zeroes only the blocks above its block id.

mod common;

use common::eagle3_head::{HeadSpec, RandomHead};
use common::engine::{collect, counter, submit};
use common::first_two::{
    assert_first_two_follow, assert_uniform_drafts_accepted, cpu_distribution,
    first_two_distributions,
};
use common::reference::argmax;
use common::tiny_model::{TinyModel, TinySpec};
use metrics_util::debugging::DebuggingRecorder;
use peregrine_actors::backend::{cpu_backend, PoolInfo};
use peregrine_actors::draft::{DraftMethod, Eagle3, LAZY_ROWS};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::messages::{
    HiddenData, HiddenRows, ProposeSeq, RequestId, SchedulerLimits, Usage,
};
use peregrine_models::eagle3::{Eagle3Config, Eagle3Head, HeadInput};
use peregrine_models::{LlamaModel, Weights};
use peregrine_ops::sampling::SamplingParams;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

const BLOCK: usize = 4;
const NUM_BLOCKS: u64 = 64;
const TARGET_LAYERS: usize = 4;

fn target_spec() -> TinySpec {
    TinySpec {
        num_layers: TARGET_LAYERS,
        ..TinySpec::llama_tiny()
    }
}

// ---------------------------------------------------------------------------------------
// Through the serving engine.

const ENGINE_BLOCK: usize = 16;

/// Every prompt at once through the engine of the target in `target_dir`, greedy, drafting
/// with the head in `head_dir` (none: no speculation); each one's tokens and usage.
async fn served(
    target_dir: &Path,
    head_dir: Option<&Path>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<(Vec<u32>, Usage)> {
    let greedy = |_| SamplingParams::greedy();
    served_as(target_dir, head_dir, prompts, &greedy, max_tokens, false).await
}

/// [`served`] with request `i` sampled as `params(i)` says, drafting adaptively with async
/// scheduling where `adaptive`.
async fn served_as(
    target_dir: &Path,
    head_dir: Option<&Path>,
    prompts: &[Vec<u32>],
    params: &dyn Fn(usize) -> SamplingParams,
    max_tokens: usize,
    adaptive: bool,
) -> Vec<(Vec<u32>, Usage)> {
    let model = LlamaModel::load(target_dir).unwrap();
    let memory = 64 * ENGINE_BLOCK as u64 * model.kv_bytes_per_token();
    let target = cpu_backend(model, memory, ENGINE_BLOCK).unwrap();
    let drafter = head_dir.map(|dir| {
        let head = Eagle3Head::from_weights(
            Eagle3Config::from_dir(dir).unwrap(),
            &Weights::open(dir).unwrap(),
            target.config(),
            target.embedding_table().unwrap(),
        )
        .unwrap();
        Box::new(Eagle3::new(head, target.config(), target.pool()).unwrap()) as Box<dyn DraftMethod>
    });
    let settings = EngineSettings {
        block_size: ENGINE_BLOCK,
        prefix_caching: false,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens: 48,
            max_waiting: prompts.len().max(1000),
            num_speculative_tokens: 3,
            speculative_adaptive: adaptive,
        },
        max_model_len: None,
        async_scheduling: adaptive,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(target, &settings, drafter).unwrap();
    let mut streams = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let params = params(i);
        streams.push(submit(&engine.scheduler, i as u64, prompt, &params, max_tokens).await);
    }
    let mut out = Vec::new();
    for rx in streams {
        let (tokens, _, usage) = collect(rx).await;
        out.push((tokens, usage));
    }
    out
}

/// Random prompts of 3 to 60 tokens (longer ones are prefilled in chunks).
fn engine_prompts(vocab: usize, n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = rng.random_range(3..60);
            (0..len)
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect()
}

/// Greedy outputs with a random head's drafts (nearly all rejected) equal the outputs
/// without speculation, token for token, in a batch with chunked prefills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_outputs_with_eagle3_equal_those_without() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 51);
    target.write_hf(&dir.path().join("target"));
    for (spec, name) in [
        (HeadSpec::midlayer(), "midlayer"),
        (HeadSpec::layers0(), "layers0"),
    ] {
        RandomHead::new(&spec, &target.spec, 52).write(&dir.path().join(name));
    }
    let prompts = engine_prompts(target.spec.vocab_size, 10, 53);
    let plain = served(&dir.path().join("target"), None, &prompts, 24).await;
    for name in ["midlayer", "layers0"] {
        let head = dir.path().join(name);
        let eagle = served(&dir.path().join("target"), Some(&head), &prompts, 24).await;
        for (i, (want, got)) in plain.iter().zip(&eagle).enumerate() {
            assert_eq!(got.0, want.0, "{name}: request {i}");
        }
        let drafted: usize = eagle.iter().map(|(_, u)| u.num_draft_tokens).sum();
        assert!(drafted > 0, "{name}: no drafts were proposed");
    }
}

/// With adaptive drafting, which pauses a random head's drafts, the plain steps between
/// queue their successors ahead (async scheduling) and hand the head their hidden states:
/// greedy outputs still equal those without speculation.
#[tokio::test]
async fn greedy_outputs_with_adaptive_eagle3_and_steps_queued_ahead_equal_those_without() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 54);
    target.write_hf(&dir.path().join("target"));
    RandomHead::new(&HeadSpec::midlayer(), &target.spec, 55).write(&dir.path().join("head"));
    let prompts = engine_prompts(target.spec.vocab_size, 6, 56);
    let target_dir = dir.path().join("target");
    let head = dir.path().join("head");
    let greedy = |_| SamplingParams::greedy();
    let plain = served(&target_dir, None, &prompts, 48).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let eagle = served_as(&target_dir, Some(&head), &prompts, &greedy, 48, true).await;
    for (i, (want, got)) in plain.iter().zip(&eagle).enumerate() {
        assert_eq!(got.0, want.0, "request {i}");
    }
    let snapshot = snapshotter.snapshot().into_vec();
    assert!(
        counter(&snapshot, "peregrine:decode_ahead_tokens_total") > 0,
        "no plain step came from a step queued ahead"
    );
}

/// A target whose logits are all equal (final norm zeroed) always picks token 0, and a
/// head whose draft logits are all equal always drafts draft id 0, mapped to token 0:
/// every draft is accepted, and the outputs still equal those without speculation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_eagle3_drafts_keep_greedy_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = TinyModel::random(target_spec(), 61);
    let norm = target.tensors.get_mut("model.norm.weight").unwrap();
    norm.1.iter_mut().for_each(|w| *w = 0.0);
    target.write_hf(&dir.path().join("target"));
    let mut head = RandomHead::new(&HeadSpec::layers0(), &target.spec, 62);
    let lm_head = head.tensors.get_mut("lm_head.weight").unwrap();
    lm_head.1.iter_mut().for_each(|w| *w = 0.0);
    head.d2t[0] = 0;
    head.write(&dir.path().join("head"));
    let prompts = engine_prompts(target.spec.vocab_size, 6, 63);
    let plain = served(&dir.path().join("target"), None, &prompts, 16).await;
    let eagle = served(
        &dir.path().join("target"),
        Some(&dir.path().join("head")),
        &prompts,
        16,
    )
    .await;
    for (i, (want, got)) in plain.iter().zip(&eagle).enumerate() {
        assert_eq!(got.0, want.0, "request {i}");
        assert!(got.0.iter().all(|&t| t == 0), "request {i}: {:?}", got.0);
        assert!(got.1.num_draft_tokens > 0, "request {i}: no drafts");
        assert_eq!(
            got.1.num_accepted_tokens, got.1.num_draft_tokens,
            "request {i}"
        );
    }
}

/// Sampled requests draft from the head's distribution at their temperature and verify
/// against it: the first two tokens (the second one verified, its draft accepted or
/// rejected) keep the target's own distribution, by Pearson's chi-square over the 3 x 3
/// cells that top-k 3 leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_eagle3_drafts_keep_the_target_distribution() {
    const DRAWS: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 71);
    target.write_hf(&dir.path().join("target"));
    let prompt: Vec<u32> = vec![11, 12, 13, 11, 12, 13, 11, 12];
    let params = |seed: usize| SamplingParams {
        temperature: 0.7,
        top_k: 3,
        seed: Some(seed as u64),
        ..SamplingParams::default()
    };
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let sampler = peregrine_ops::sampling::Sampler::new(&params(0)).unwrap();
    let dist = |tokens: &[u32]| cpu_distribution(&model, &sampler, &prompt, tokens);
    let (first, second) = first_two_distributions(&prompt, dist);
    // A head whose draft logits are all equal: each draft is drawn uniformly from draft
    // ids 0..32 (its top 32, the first among equal logits), mapped first to the tokens
    // the target keeps for the first two positions, then to the other ids in order.
    let mut likely: Vec<u32> = first.iter().map(|&(t, _)| t).collect();
    likely.extend(second.iter().flatten().map(|&(t, _)| t));
    likely.sort_unstable();
    likely.dedup();
    let mut head = RandomHead::new(&HeadSpec::layers0(), &target.spec, 72);
    let lm_head = head.tensors.get_mut("lm_head.weight").unwrap();
    lm_head.1.iter_mut().for_each(|w| *w = 0.0);
    let rest = (0..target.spec.vocab_size as u32).filter(|t| !likely.contains(t));
    let order: Vec<u32> = likely.iter().copied().chain(rest).collect();
    for (draft, offset) in head.d2t.iter_mut().enumerate() {
        *offset = i64::from(order[draft]) - draft as i64;
    }
    head.write(&dir.path().join("head"));
    let prompts = vec![prompt.clone(); DRAWS];
    let (target_dir, head_dir) = (dir.path().join("target"), dir.path().join("head"));
    let outs = served_as(&target_dir, Some(&head_dir), &prompts, &params, 3, false).await;
    let (accepted, drafts) = assert_uniform_drafts_accepted(&outs, &first, &second, &order[..32]);
    let note = format!(", {accepted} of {drafts} drafts accepted");
    assert_first_two_follow(&outs, &first, &second, &note);
}

/// The CPU target pool of the model in `dir`: `NUM_BLOCKS` blocks of `BLOCK` tokens, the
/// last of them its scratch block.
fn target_pool(dir: &Path) -> PoolInfo {
    let model = LlamaModel::load(dir).unwrap();
    let memory = (NUM_BLOCKS - 1) * BLOCK as u64 * model.kv_bytes_per_token();
    let pool = cpu_backend(model, memory, BLOCK).unwrap().pool().clone();
    assert_eq!(pool.layout.num_blocks, NUM_BLOCKS);
    pool
}

/// The drafts the head gives after `tokens` (the target has run all but the last), from
/// fresh caches in one step-0 chunk: what the proposer must reproduce bit for bit.
fn expected_drafts(model: &LlamaModel, head: &Eagle3Head, tokens: &[u32], k: usize) -> Vec<u32> {
    let blocks: Vec<u32> = (0..NUM_BLOCKS as u32).rev().collect();
    let mut target_cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let mut head_cache = KvCache::new(1, head.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let n = tokens.len() - 1;
    let plan = |num_cached, num_new| {
        let spec = SeqSpec {
            num_cached,
            num_new,
            block_table: &blocks,
        };
        AttentionPlan::new(&[spec], BLOCK, NUM_BLOCKS).unwrap()
    };
    let p = plan(0, n);
    let (_, aux) = model
        .forward_with_aux(&tokens[..n], &p, &mut target_cache, &[], head.aux_layers())
        .unwrap();
    let out = head
        .forward(
            &tokens[1..],
            HeadInput::Aux(&aux),
            &p,
            &mut head_cache,
            &[n - 1],
        )
        .unwrap();
    let h = head.config().hidden_size;
    let mut drafts = head.vocab().greedy(&out.logits);
    let mut pre = out.pre[(n - 1) * h..].to_vec();
    while drafts.len() < k {
        let p = plan(n - 1 + drafts.len(), 1);
        let token = [*drafts.last().unwrap()];
        let out = head
            .forward(&token, HeadInput::Pre(&pre), &p, &mut head_cache, &[0])
            .unwrap();
        drafts.extend(head.vocab().greedy(&out.logits));
        pre = out.pre;
    }
    drafts
}

/// The proposer pairs each target feature with the next token, at the target's positions,
/// drops the rows of rejected drafts and overwrites their head KV: after a prompt in two
/// chunks, and after a verify step that accepted one draft, its drafts are those of the
/// head run afresh over the whole history. (The head's q and k are scaled up so that its
/// attention is sharp and a wrong position or row changes the drafts.)
#[test]
fn the_proposer_drafts_what_the_head_gives_over_the_verified_history() {
    const K: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 71);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let pool = target_pool(&dir.path().join("target"));
    for seed in 0..6 {
        let head_dir = dir.path().join(format!("head{seed}"));
        RandomHead::new(&HeadSpec::midlayer(), &target.spec, 72 + seed)
            .sharpened()
            .write(&head_dir);
        let load = || Eagle3Head::load(&head_dir, &model).unwrap();
        let (head, reference) = (load(), load());
        let mut method = Eagle3::new(head, model.config(), &pool).unwrap();
        assert_eq!(method.hidden_layers(), Some(vec![0, 2, 3]));
        let mut rng = ChaCha8Rng::seed_from_u64(73 + seed);
        let mut tokens: Vec<u32> = (0..19).map(|_| rng.random_range(0..300)).collect();
        let blocks = vec![9, 3, 17, 0, 12, 6, 21, 2];
        let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
        let id = RequestId(7);
        // The target runs `fed` from position `start`; its rows go to the proposer.
        let mut target_step = |fed: &[u32], start: usize, method: &mut Eagle3| -> Vec<f32> {
            target_chunk(&model, &mut cache, method, id, (fed, start), &blocks)
        };
        target_step(&tokens[..10], 0, &mut method);
        let logits = target_step(&tokens[10..], 10, &mut method);
        tokens.push(argmax(&logits));
        let propose = |tokens: &[u32], method: &mut Eagle3| {
            let seq = ProposeSeq {
                id,
                tokens: tokens.into(),
                block_table: blocks.clone(),
                max_drafts: K,
                sampling: None,
                drafts_paused: false,
            };
            method.propose(&[seq]).unwrap().remove(0).tokens
        };
        let drafts = propose(&tokens, &mut method);
        assert_eq!(
            drafts,
            expected_drafts(&model, &reference, &tokens, K),
            "seed {seed}"
        );
        // Verify [last, d1..dK]: d1 accepted, then a correction that is not d2.
        let mut fed = vec![*tokens.last().unwrap()];
        fed.extend(&drafts);
        target_step(&fed, tokens.len() - 1, &mut method);
        tokens.push(drafts[0]);
        tokens.push((drafts[1] + 1) % 300);
        let drafts = propose(&tokens, &mut method);
        assert_eq!(
            drafts,
            expected_drafts(&model, &reference, &tokens, K),
            "seed {seed}"
        );
    }
}

/// A random target (seed `seed`) and a sharpened random head over it (seed `seed + 1`),
/// loaded twice: as the proposer's method and as the reference `expected_drafts` runs.
struct Drafting {
    model: LlamaModel,
    method: Eagle3,
    reference: Eagle3Head,
    /// Holds the checkpoints.
    _dir: tempfile::TempDir,
}

fn drafting(seed: u64) -> Drafting {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), seed);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let pool = target_pool(&dir.path().join("target"));
    let head_dir = dir.path().join("head");
    RandomHead::new(&HeadSpec::midlayer(), &target.spec, seed + 1)
        .sharpened()
        .write(&head_dir);
    let load = || Eagle3Head::load(&head_dir, &model).unwrap();
    let (head, reference) = (load(), load());
    let method = Eagle3::new(head, model.config(), &pool).unwrap();
    Drafting {
        model,
        method,
        reference,
        _dir: dir,
    }
}

/// The target runs `fed` from position `start` of request `id` over `table` (its KV in
/// `cache`) and hands its features to `method`; returns the logits of the last row.
fn target_chunk(
    model: &LlamaModel,
    cache: &mut KvCache,
    method: &mut Eagle3,
    id: RequestId,
    (fed, start): (&[u32], usize),
    table: &[u32],
) -> Vec<f32> {
    let spec = SeqSpec {
        num_cached: start,
        num_new: fed.len(),
        block_table: table,
    };
    let plan = AttentionPlan::new(&[spec], BLOCK, NUM_BLOCKS).unwrap();
    let (logits, aux) = model
        .forward_with_aux(fed, &plan, cache, &[fed.len() - 1], &[0, 2, 3])
        .unwrap();
    method.receive_hidden(vec![HiddenRows {
        id,
        first_pos: start,
        data: HiddenData::Host(aux),
    }]);
    logits
}

/// The head's K at position `pos` of a sequence over `table`, in its one-layer cache.
fn head_kv(method: &Eagle3, table: &[u32], pos: usize) -> Vec<f32> {
    let per_slot = method.cache().layout().slot_elems() as usize;
    let slot = table[pos / BLOCK] as usize * BLOCK + pos % BLOCK;
    method.cache().layer(0).0[slot * per_slot..(slot + 1) * per_slot].to_vec()
}

/// The fault hook (the soak's fault run) zeroes the head's KV in the blocks above its
/// block id after each forward, and only there: the draft steps then read zeros past it.
#[test]
fn the_fault_hook_zeroes_the_heads_kv_above_its_block_id_only() {
    let Drafting { model, method, .. } = drafting(91);
    let mut method = method.with_kv_fault_above(10);
    let mut rng = ChaCha8Rng::seed_from_u64(93);
    let mut tokens: Vec<u32> = (0..13).map(|_| rng.random_range(0..300)).collect();
    // Positions 0..4 in block 5, 4..8 in 11, 8..12 in 2, 12..16 in 19.
    let blocks = vec![5, 11, 2, 19, 7, 14];
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let id = RequestId(4);
    let logits = target_chunk(&model, &mut cache, &mut method, id, (&tokens, 0), &blocks);
    tokens.push(argmax(&logits));
    let seq = ProposeSeq {
        id,
        tokens: tokens.clone(),
        block_table: blocks.clone(),
        max_drafts: 3,
        sampling: None,
        drafts_paused: false,
    };
    let drafts = method.propose(&[seq]).unwrap().remove(0).tokens;
    assert_eq!(drafts.len(), 3);
    for pos in 0..16 {
        let zero = head_kv(&method, &blocks, pos).iter().all(|&v| v == 0.0);
        assert_eq!(zero, blocks[pos / BLOCK] > 10, "position {pos}");
    }
}

/// A request planned without drafts runs the head's step 0 over the target's rows where
/// its last token is due (`drafts_paused` false), so that the head's KV holds its answer;
/// where drafting is paused (it does not pay at the batch size) its rows wait, and run
/// in the step that drafts again, whose drafts are those of the head run afresh, or once
/// `LAZY_ROWS` of them wait.
#[test]
fn a_request_planned_without_drafts_runs_step_0_now_or_when_it_drafts_again() {
    const K: usize = 3;
    let Drafting {
        model,
        mut method,
        reference,
        ..
    } = drafting(81);
    let mut rng = ChaCha8Rng::seed_from_u64(83);
    let mut tokens: Vec<u32> = (0..13).map(|_| rng.random_range(0..300)).collect();
    let blocks: Vec<u32> = (0..48).map(|b| (b * 7 + 3) % NUM_BLOCKS as u32).collect();
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let id = RequestId(3);
    let mut start = 0;
    let zero = vec![0.0; head_kv(&method, &blocks, 0).len()];
    // (max_drafts, drafts_paused) per step: due, paused twice, drafting, paused.
    let plan = [(0, false), (0, true), (0, true), (K, false), (0, true)];
    for (step, &(max_drafts, drafts_paused)) in plan.iter().enumerate() {
        // The target runs what is not in its cache yet and samples the next token.
        let fed = (&tokens[start..], start);
        let logits = target_chunk(&model, &mut cache, &mut method, id, fed, &blocks);
        start = tokens.len();
        tokens.push(argmax(&logits));
        let last_row = tokens.len() - 2;
        let before = head_kv(&method, &blocks, last_row);
        let seq = ProposeSeq {
            id,
            tokens: tokens.clone(),
            block_table: blocks.clone(),
            max_drafts,
            sampling: None,
            drafts_paused,
        };
        let drafts = method.propose(&[seq]).unwrap().remove(0).tokens;
        let written = head_kv(&method, &blocks, last_row) != before;
        assert_eq!(
            written, !drafts_paused,
            "step {step}: the last row's head KV"
        );
        if max_drafts == 0 {
            assert!(drafts.is_empty(), "step {step}: {drafts:?}");
        } else {
            assert_eq!(drafts, expected_drafts(&model, &reference, &tokens, K));
            for pos in 0..tokens.len() - 1 {
                assert_ne!(head_kv(&method, &blocks, pos), zero, "position {pos}");
            }
        }
    }
    // LAZY_ROWS rows waiting run at once, paused or not.
    let more: Vec<u32> = (0..LAZY_ROWS).map(|_| rng.random_range(0..300)).collect();
    tokens.extend(&more);
    let fed = (&tokens[start..], start);
    let logits = target_chunk(&model, &mut cache, &mut method, id, fed, &blocks);
    tokens.push(argmax(&logits));
    let seq = ProposeSeq {
        id,
        tokens: tokens.clone(),
        block_table: blocks.clone(),
        max_drafts: 0,
        sampling: None,
        drafts_paused: true,
    };
    assert!(method.propose(&[seq]).unwrap().remove(0).tokens.is_empty());
    assert_ne!(head_kv(&method, &blocks, tokens.len() - 2), zero);
}

/// A prompt computed in chunks runs the head's step 0 over each chunk in the proposal
/// after it (the scheduler proposes prompt chunks with no room for drafts), so that the
/// target's features wait one step at most; once the prompt is done the drafts are those
/// of the head run afresh.
#[test]
fn each_prompt_chunk_runs_step_0_in_the_next_proposal() {
    const K: usize = 3;
    let Drafting {
        model,
        mut method,
        reference,
        ..
    } = drafting(85);
    let mut rng = ChaCha8Rng::seed_from_u64(87);
    let mut tokens: Vec<u32> = (0..19).map(|_| rng.random_range(0..300)).collect();
    let blocks = vec![3, 17, 8, 12, 1, 20];
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    let id = RequestId(4);
    for (start, end) in [(0, 7), (7, 14), (14, 19)] {
        let fed = (&tokens[start..end], start);
        let logits = target_chunk(&model, &mut cache, &mut method, id, fed, &blocks);
        let last_chunk = end == 19;
        if last_chunk {
            tokens.push(argmax(&logits));
        }
        let before = head_kv(&method, &blocks, end - 1);
        let seq = ProposeSeq {
            id,
            tokens: tokens.clone(),
            block_table: blocks.clone(),
            max_drafts: if last_chunk { K } else { 0 },
            sampling: None,
            drafts_paused: false,
        };
        let drafts = method.propose(&[seq]).unwrap().remove(0).tokens;
        assert_ne!(
            head_kv(&method, &blocks, end - 1),
            before,
            "chunk {start}..{end}: the head's KV of its last position was not written"
        );
        if last_chunk {
            assert_eq!(drafts, expected_drafts(&model, &reference, &tokens, K));
        } else {
            assert!(drafts.is_empty(), "chunk {start}..{end}: {drafts:?}");
        }
    }
}

/// A sequence served from the prefix cache drafts from the head KV its shared blocks hold:
/// its drafts are those of the head run afresh over its whole history. A shared block
/// whose last position the head paired with another next token, or that another sequence
/// has taken since, gives no drafts (its output would be unchanged, its acceptance lost).
#[test]
fn a_prefix_hit_drafts_from_the_head_kv_its_shared_blocks_hold() {
    const K: usize = 4;
    let Drafting {
        model,
        mut method,
        reference,
        ..
    } = drafting(81);
    let mut cache = KvCache::new(TARGET_LAYERS, model.kv_layout(NUM_BLOCKS, BLOCK as u64));
    // The target runs `tokens[start..]` of request `id` over `table`, hands its features to
    // the proposer and samples the next token greedily; then the proposer drafts.
    let mut serve = |id: u64, tokens: &mut Vec<u32>, table: &[u32], start: usize| {
        let (id, fed) = (RequestId(id), (&tokens[start..], start));
        let logits = target_chunk(&model, &mut cache, &mut method, id, fed, table);
        tokens.push(argmax(&logits));
        let seq = ProposeSeq {
            id,
            tokens: tokens.clone(),
            block_table: table.to_vec(),
            max_drafts: K,
            sampling: None,
            drafts_paused: false,
        };
        method.propose(&[seq]).unwrap().remove(0).tokens
    };
    let mut rng = ChaCha8Rng::seed_from_u64(83);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..300)).collect() };
    // A computes 14 tokens: the head's step 0 covers its first three blocks.
    let mut a = random(14);
    let drafts = serve(1, &mut a, &[9, 3, 17, 0, 12], 0);
    assert_eq!(drafts, expected_drafts(&model, &reference, &a, K));
    // B shares A's first two blocks and the token after them: it drafts as if it had run
    // from the start.
    let mut b = a[..9].to_vec();
    b.extend(random(6));
    let drafts = serve(2, &mut b, &[9, 3, 5, 14, 8], 8);
    assert_eq!(drafts.len(), K);
    assert_eq!(drafts, expected_drafts(&model, &reference, &b, K));
    // C shares the two blocks but not the token after them: the head paired their last
    // position with A's.
    let mut c = a[..8].to_vec();
    c.push((a[8] + 1) % 300);
    c.extend(random(5));
    assert_eq!(serve(3, &mut c, &[9, 3, 6, 20, 1], 8), Vec::<u32>::new());
    // D takes block 3 for other tokens; then a hit on A's prefix finds it changed.
    let mut d = random(6);
    assert_eq!(serve(4, &mut d, &[3, 10, 13], 0).len(), K);
    let mut e = a[..9].to_vec();
    e.extend(random(4));
    assert_eq!(serve(5, &mut e, &[9, 3, 7, 11], 8), Vec::<u32>::new());
}

/// The head states the bytes one block takes in its one layer's K (or V) tensor, for the
/// acceptance alarm's byte-offset bands.
#[test]
fn the_head_states_its_kv_bytes_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let target = TinyModel::random(target_spec(), 81);
    target.write_hf(&dir.path().join("target"));
    let model = LlamaModel::load(&dir.path().join("target")).unwrap();
    let pool = target_pool(&dir.path().join("target"));
    let head_dir = dir.path().join("head");
    RandomHead::new(&HeadSpec::midlayer(), &target.spec, 84).write(&head_dir);
    let head = Eagle3Head::load(&head_dir, &model).unwrap();
    let method = Eagle3::new(head, model.config(), &pool).unwrap();
    let cache = method.cache();
    let per_tensor = cache.bytes_per_layer() / 2;
    assert_eq!(
        method.kv_bytes_per_block(),
        Some(per_tensor / cache.layout().num_blocks)
    );
}
