//! An EAGLE-3 head on the GPU against the CPU head (the plain f32 reference of the same
//! checkpoint) on fresh random features, and its decode graphs against its eager steps:
//! the same drafts and `pre` bit for bit at exact and padded batches, the padded rows'
//! keys and values in the scratch block only. And the target's side: the layer inputs a
//! GPU forward records for the head, against the CPU model's.

use crate::common::eagle3_head::{HeadSpec, RandomHead};
use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::model::gpu_sized;
use crate::{random_f32, rng, setup};
use half::bf16;
use peregrine_actors::draft::{GpuHead, HeadCapacity, HeadRunner};
use peregrine_kernels::GEMV_MAX_ROWS;
use peregrine_models::eagle3::cuda::GpuEagle3Head;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::eagle3::{Eagle3Head, HeadInput};
use peregrine_models::graph::cuda::GraphLimits;
use peregrine_models::llama::cuda::{AuxHandOff, GpuLlama, GpuModelOptions, GreedyInput};
use peregrine_models::LlamaModel;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::{AttentionPlan, KvCache, SeqSpec};
use peregrine_runtime::cuda::cudarc::driver::CudaView;
use rand::Rng;
use std::cell::RefCell;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub(crate) const BLOCK: usize = 16;
/// Blocks of the caches: four per sequence for up to 8 sequences, then the scratch block.
pub(crate) const NUM_BLOCKS: u64 = 33;
pub(crate) const SCRATCH: u32 = 32;

/// A head of the GPU's kernel shapes (head_dim 64) for a target of `gpu_sized` shapes with
/// 4 layers; aux layers 0, 2, 3, or the default (2, 2, 1) when `norm_before_residual`.
pub fn gpu_head_spec(norm_before_residual: bool, own_embed: bool) -> HeadSpec {
    HeadSpec {
        hidden: 256,
        intermediate: 512,
        heads: 4,
        kv_heads: 2,
        head_dim: Some(64),
        draft_vocab: 400,
        target_hidden: None,
        aux_ids: (!norm_before_residual).then(|| vec![0, 2, 3]),
        prefix: if norm_before_residual {
            "layers.0"
        } else {
            "midlayer"
        },
        norm_before_residual,
        own_embed,
        rope_theta: 10_000.0,
        rope_linear: None,
    }
}

/// The target spec the heads are written for.
pub fn gpu_target_spec() -> TinySpec {
    TinySpec {
        num_layers: 4,
        ..gpu_sized(TinySpec::llama_tiny())
    }
}

/// Writes a random target to `dir/target` and a random head of `spec` to `dir/head`.
pub fn write_target_and_head(dir: &Path, spec: &HeadSpec, seed: u64) {
    let target = TinyModel::random(gpu_target_spec(), seed);
    target.write_hf(&dir.join("target"));
    RandomHead::new(spec, &target.spec, seed + 1).write(&dir.join("head"));
}

fn options(deterministic: bool) -> GpuModelOptions {
    GpuModelOptions {
        max_tokens: 256,
        max_logit_rows: 16,
        deterministic,
        gemv_max_rows: GEMV_MAX_ROWS,
    }
}

/// The CPU head of `dir` and the same head on the GPU.
pub(crate) fn heads(dir: &Path, deterministic: bool) -> (Eagle3Head, GpuEagle3Head) {
    let s = setup().expect("a GPU");
    let target = LlamaModel::load(&dir.join("target")).unwrap();
    let host = Eagle3Head::load(&dir.join("head"), &target).unwrap();
    let (gpu, kernels) = (s.gpu.clone(), s.kernels.clone());
    let max_positions = target.config().max_model_len;
    let gpu_head =
        GpuEagle3Head::from_host(&host, max_positions, gpu, kernels, options(deterministic))
            .unwrap();
    (host, gpu_head)
}

/// A runner of the head of `dir` reading `ring` (deterministic), its buffers holding step
/// 0 rows of up to four a sequence through graphs, with its cache.
pub(crate) fn ring_runner(
    dir: &Path,
    ring: &Arc<FeatureRing>,
) -> (GpuHead, Arc<Mutex<GpuKvCache>>) {
    let s = setup().expect("a GPU");
    let (host, mut head) = heads(dir, true);
    head.read_features_from(ring.clone()).unwrap();
    let layout = host.kv_layout(NUM_BLOCKS, BLOCK as u64);
    let cache = Arc::new(Mutex::new(GpuKvCache::new(&s.gpu, 1, layout).unwrap()));
    let capacity = HeadCapacity {
        max_tokens: 256,
        max_logit_rows: 16,
        first_rows: 4,
    };
    let scratch = i64::from(SCRATCH) * BLOCK as i64;
    let head = GpuHead::new(head, cache.clone(), capacity, scratch, 1024);
    (head, cache)
}

/// Sequence `i`'s block table: blocks i, i + 8, i + 16, i + 24.
pub(crate) fn table(i: usize) -> Vec<u32> {
    (0..4).map(|j| (i + 8 * j) as u32).collect()
}

/// The first step of sequences of `lens` new tokens over `tables`, and the row of each
/// sequence's last token.
pub(crate) fn first_step<'a>(
    lens: &[usize],
    tables: &'a [Vec<u32>],
) -> (Vec<SeqSpec<'a>>, Vec<usize>) {
    let specs = lens
        .iter()
        .zip(tables)
        .map(|(&n, t)| SeqSpec {
            num_cached: 0,
            num_new: n,
            block_table: t,
        })
        .collect();
    let last_rows = lens
        .iter()
        .scan(0, |end, &n| {
            *end += n;
            Some(*end - 1)
        })
        .collect();
    (specs, last_rows)
}

/// Fails unless every value of `got` is within `frac` of the largest magnitude of `want`.
fn assert_near(what: &str, got: &[f32], want: &[f32], frac: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0f32, f32::max);
    eprintln!("{what}: largest error {worst} of a largest value {scale}");
    assert!(
        worst <= frac * scale && got.iter().all(|v| v.is_finite()),
        "{what}: error {worst} past {frac} of {scale}"
    );
}

/// The rows `rows` of `[_, h]` values.
fn rows_of(values: &[f32], rows: &[usize], h: usize) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| &values[r * h..(r + 1) * h])
        .copied()
        .collect()
}

/// Step 0 over prompts of `lens` tokens fed random target features, then three draft steps
/// of one row per sequence fed the CPU's `pre` and drafts: the GPU's logits and `pre` stay
/// within bf16 error of the CPU's, and its drafts are the CPU's wherever the CPU's best
/// draft leads its runner-up clearly.
fn gpu_head_follows_the_cpu_head(spec: HeadSpec, seed: u64) {
    if setup().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_target_and_head(dir.path(), &spec, seed);
    let (host, mut gpu_head) = heads(dir.path(), false);
    let c = host.config().clone();
    let (h, width) = (
        c.hidden_size,
        host.aux_layers().len() * c.target_hidden_size,
    );
    let layout = host.kv_layout(NUM_BLOCKS, BLOCK as u64);
    let mut cpu_cache = KvCache::new(1, layout);
    let mut gpu_cache = GpuKvCache::new(setup().unwrap().gpu.as_ref(), 1, layout).unwrap();
    let mut rng = rng("gpu_head_follows_the_cpu_head");
    let lens = [7usize, 12, 1, 30, 3, 9, 20, 5];
    let tables: Vec<Vec<u32>> = (0..lens.len()).map(table).collect();
    let (specs, mut rows) = first_step(&lens, &tables);
    let total: usize = lens.iter().sum();
    let mut tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
    let aux = random_f32(&mut rng, total * width, 2.0);
    let mut input = aux;
    let (mut clear, mut agree) = (0, 0);
    for step in 0..4 {
        let plan = AttentionPlan::new(&specs_at(&specs, step), BLOCK, NUM_BLOCKS).unwrap();
        let feature = if step == 0 {
            HeadInput::Aux(&input)
        } else {
            HeadInput::Pre(&input)
        };
        let want = host
            .forward(&tokens, feature, &plan, &mut cpu_cache, &rows)
            .unwrap();
        let got = gpu_head
            .forward(&tokens, feature, &plan, &mut gpu_cache, &rows)
            .unwrap();
        assert_near(
            &format!("step {step} logits"),
            &got.logits,
            &want.logits,
            0.03,
        );
        assert_near(&format!("step {step} pre"), &got.pre, &want.pre, 0.03);
        let drafts = host.vocab().greedy(&want.logits);
        let v = c.draft_vocab_size;
        for (r, (cpu_row, gpu_row)) in want.logits.chunks(v).zip(got.logits.chunks(v)).enumerate() {
            let mut sorted = cpu_row.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let range = sorted[0] - sorted[v - 1];
            if sorted[0] - sorted[1] > 0.02 * range {
                clear += 1;
                let gpu_best = host.vocab().greedy(gpu_row)[0];
                assert_eq!(
                    gpu_best, drafts[r],
                    "step {step} row {r}: a clear draft differs"
                );
                agree += 1;
            }
        }
        // The next step: one row per sequence, the CPU's draft fed its `pre`.
        input = rows_of(&want.pre, &rows, h);
        tokens = drafts;
        rows = (0..lens.len()).collect();
    }
    eprintln!("{agree} of {clear} clear drafts agree");
    assert!(clear >= 8, "only {clear} clear drafts of 32");
}

/// `specs` after `step` one-row draft steps: step 0 is `specs` itself.
fn specs_at<'a>(specs: &[SeqSpec<'a>], step: usize) -> Vec<SeqSpec<'a>> {
    specs
        .iter()
        .map(|s| match step {
            0 => *s,
            _ => SeqSpec {
                num_cached: s.num_new + step - 1,
                num_new: 1,
                block_table: s.block_table,
            },
        })
        .collect()
}

#[test]
fn gpu_head_follows_the_cpu_head_midlayer() {
    gpu_head_follows_the_cpu_head(gpu_head_spec(false, true), 31);
}

#[test]
fn gpu_head_follows_the_cpu_head_norm_before_residual() {
    gpu_head_follows_the_cpu_head(gpu_head_spec(true, false), 32);
}

/// The bits of every block of the one-layer `cache`, K then V, block by block.
pub(crate) fn blocks(cache: &GpuKvCache) -> Vec<Vec<u16>> {
    let gpu = &setup().unwrap().gpu;
    let (k, v) = cache.layer(0);
    let (k, v): (Vec<bf16>, Vec<bf16>) = (gpu.download(k).unwrap(), gpu.download(v).unwrap());
    let per_block = k.len() / NUM_BLOCKS as usize;
    (0..NUM_BLOCKS as usize)
        .map(|b| {
            let range = b * per_block..(b + 1) * per_block;
            k[range.clone()]
                .iter()
                .chain(&v[range])
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

/// Deterministic mode: after the same step 0, draft steps of 5, 3, 2 and 1 sequences (the
/// graphs hold 1, 2, 4 and 8, so the first two pad) replayed through graphs give exactly
/// the eager steps' drafts and `pre`, and leave every block of the cache as the eager
/// steps do but the scratch block, which only the padded rows wrote.
#[test]
fn head_graphs_draft_exactly_as_eager_steps_and_pad_into_the_scratch_block() {
    let Some(s) = setup() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_target_and_head(dir.path(), &gpu_head_spec(false, true), 33);
    let (host, mut eager) = heads(dir.path(), true);
    let (_, mut graphed) = heads(dir.path(), true);
    let c = host.config().clone();
    let (h, width) = (
        c.hidden_size,
        host.aux_layers().len() * c.target_hidden_size,
    );
    let layout = host.kv_layout(NUM_BLOCKS, BLOCK as u64);
    let mut eager_cache = GpuKvCache::new(&s.gpu, 1, layout).unwrap();
    let graph_cache = Arc::new(Mutex::new(GpuKvCache::new(&s.gpu, 1, layout).unwrap()));
    let mut rng = rng("head_graphs_draft_exactly_as_eager_steps");
    let n = 5;
    let tables: Vec<Vec<u32>> = (0..n).map(table).collect();
    let lens: Vec<usize> = (0..n).map(|_| rng.random_range(2..40)).collect();
    let (specs, rows) = first_step(&lens, &tables);
    let total: usize = lens.iter().sum();
    let tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
    let aux = random_f32(&mut rng, total * width, 2.0);
    let plan = AttentionPlan::new(&specs, BLOCK, NUM_BLOCKS).unwrap();
    let first = eager
        .forward_greedy(
            &tokens,
            HeadInput::Aux(&aux),
            &plan,
            &mut eager_cache,
            &rows,
            false,
        )
        .unwrap();
    let first_graphed = {
        let mut cache = graph_cache.lock().unwrap();
        graphed
            .forward_greedy(
                &tokens,
                HeadInput::Aux(&aux),
                &plan,
                &mut cache,
                &rows,
                false,
            )
            .unwrap()
    };
    assert_eq!(first, first_graphed, "step 0 on two copies of the head");
    let limits = GraphLimits {
        max_rows: 8,
        max_context: 1024,
        scratch_slot: i64::from(SCRATCH) * BLOCK as i64,
    };
    let graphs: Vec<_> = [8, 4, 2, 1]
        .into_iter()
        .map(|size| graphed.capture_decode(size, limits, &graph_cache).unwrap())
        .collect();
    let scratch_before = blocks(&graph_cache.lock().unwrap())[SCRATCH as usize].clone();
    let mut drafts = first.drafts;
    let mut pre = rows_of(&first.pre, &rows, h);
    for (step, m) in [5usize, 3, 2, 1].into_iter().enumerate() {
        let step_specs: Vec<SeqSpec> = specs_at(&specs, step + 1)[..m].to_vec();
        let plan = AttentionPlan::new(&step_specs, BLOCK, NUM_BLOCKS).unwrap();
        let (tokens, input) = (&drafts[..m], &pre[..m * h]);
        // Every other step also brings the logits back (a sampled request's drafts).
        let logits = step % 2 == 1;
        let want = eager
            .forward_greedy(
                tokens,
                HeadInput::Pre(input),
                &plan,
                &mut eager_cache,
                &(0..m).collect::<Vec<_>>(),
                logits,
            )
            .unwrap();
        let graph = graphs.iter().rev().find(|g| g.size() >= m).unwrap();
        let got = graph.replay(tokens, input, &plan, logits).unwrap();
        assert_eq!(got.logits.is_some(), logits);
        assert_eq!(got.logits, want.logits, "step {step}: logits");
        assert_eq!(
            got.drafts,
            want.drafts,
            "step {step}: {m} rows through the graph of {}",
            graph.size()
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.pre), bits(&want.pre), "step {step}: pre");
        drafts = want.drafts;
        pre = want.pre;
    }
    let (eager_blocks, graph_blocks) = (blocks(&eager_cache), blocks(&graph_cache.lock().unwrap()));
    for b in 0..SCRATCH as usize {
        assert!(eager_blocks[b] == graph_blocks[b], "block {b} differs");
    }
    assert!(
        graph_blocks[SCRATCH as usize] != scratch_before,
        "the padded rows wrote no scratch KV"
    );
    assert!(
        eager_blocks[SCRATCH as usize].iter().all(|&b| b == 0),
        "an eager step wrote the scratch block"
    );
}

/// The target's side: a forward records the input of each named layer (repeats and any
/// order allowed) as the CPU model does, within bf16 error, and a decode graph records
/// exactly what the eager step records (deterministic mode), also handed on from a greedy
/// step and from the step it queued ahead.
#[test]
fn the_target_records_the_layer_inputs_as_the_cpu_and_its_graphs_do() {
    let Some(s) = setup() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(gpu_target_spec(), 34).write_hf(dir.path());
    let cpu = LlamaModel::load(dir.path()).unwrap();
    let options = options(true);
    let load = || GpuLlama::load(dir.path(), s.gpu.clone(), s.kernels.clone(), options).unwrap();
    let (mut eager, mut graphed) = (load(), load());
    let layers = [3, 0, 3, 1];
    eager.record_aux(&layers).unwrap();
    graphed.record_aux(&layers).unwrap();
    let c = cpu.config().clone();
    let layout = cpu.kv_layout(NUM_BLOCKS, BLOCK as u64);
    let mut cpu_cache = KvCache::new(c.num_layers, layout);
    let mut eager_cache = GpuKvCache::new(&s.gpu, c.num_layers, layout).unwrap();
    let graph_cache = Arc::new(Mutex::new(
        GpuKvCache::new(&s.gpu, c.num_layers, layout).unwrap(),
    ));
    let mut rng = rng("the_target_records_the_layer_inputs");
    let lens = [9usize, 17, 4];
    let tables: Vec<Vec<u32>> = (0..lens.len()).map(table).collect();
    let (specs, _) = first_step(&lens, &tables);
    let total: usize = lens.iter().sum();
    let tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
    let plan = AttentionPlan::new(&specs, BLOCK, NUM_BLOCKS).unwrap();
    let (_, want) = cpu
        .forward_with_aux(&tokens, &plan, &mut cpu_cache, &[total - 1], &layers)
        .unwrap();
    eager
        .forward(&tokens, &plan, &mut eager_cache, &[total - 1])
        .unwrap();
    let got = s.gpu.download(&eager.last_aux(total).unwrap()).unwrap();
    assert_near("prefill layer inputs", &got, &want, 0.03);
    {
        let mut cache = graph_cache.lock().unwrap();
        graphed
            .forward(&tokens, &plan, &mut cache, &[total - 1])
            .unwrap();
    }
    // A decode step of the three sequences, eagerly and through the graph of 4.
    let limits = GraphLimits {
        max_rows: 4,
        max_context: 1024,
        scratch_slot: i64::from(SCRATCH) * BLOCK as i64,
    };
    let graph = graphed.capture_decode(4, limits, &graph_cache).unwrap();
    let decode: Vec<SeqSpec> = specs_at(&specs, 1);
    let plan = AttentionPlan::new(&decode, BLOCK, NUM_BLOCKS).unwrap();
    let next: Vec<u32> = (0..lens.len()).map(|_| rng.random_range(0..1000)).collect();
    let rows: Vec<usize> = (0..lens.len()).collect();
    eager
        .forward(&next, &plan, &mut eager_cache, &rows)
        .unwrap();
    let want = s
        .gpu
        .download(&eager.last_aux(lens.len()).unwrap())
        .unwrap();
    let replayed = graph.replay(&next, &plan).unwrap();
    let got = s.gpu.download(&replayed.aux().unwrap()).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got),
        bits(&want),
        "decode layer inputs, graph vs eager"
    );
    assert_eq!(want.len(), lens.len() * layers.len() * c.hidden_size);
    drop(replayed);
    // The same step as a greedy step that queues the next (fed its argmax on the device),
    // then that one read: each hands on what the eager steps record, before the step
    // queued after it overwrites them.
    let handed = RefCell::new(Vec::new());
    let hand_off = || -> AuxHandOff {
        Box::new(|aux: CudaView<f32>| {
            handed.borrow_mut().push(s.gpu.download(&aux)?);
            Ok(())
        })
    };
    let after: Vec<SeqSpec> = specs_at(&specs, 2);
    let after = AttentionPlan::new(&after, BLOCK, NUM_BLOCKS).unwrap();
    let input = GreedyInput::Host {
        tokens: &next,
        plan: &plan,
    };
    let (ids, queued) = graph
        .greedy_step_handing_off(input, Some(&after), None, Some(hand_off()))
        .unwrap();
    let queued = queued.expect("a step queued ahead");
    let (ids_after, none) = graph
        .greedy_step_handing_off(GreedyInput::Queued(queued), None, None, Some(hand_off()))
        .unwrap();
    assert_eq!((ids_after.len(), none), (lens.len(), None));
    eager
        .forward(&ids, &after, &mut eager_cache, &rows)
        .unwrap();
    let want_after = s
        .gpu
        .download(&eager.last_aux(lens.len()).unwrap())
        .unwrap();
    let handed = handed.into_inner();
    assert_eq!(handed.len(), 2);
    assert_eq!(bits(&handed[0]), bits(&want), "handed on by the step");
    assert_eq!(
        bits(&handed[1]),
        bits(&want_after),
        "handed on by the step queued ahead"
    );
}

/// A step-0 catch-up past the GPU runner's buffers is cut into forwards that fit
/// (deterministic mode): the same drafts and `pre`, bit for bit, as one forward over it all.
#[test]
fn a_catch_up_past_the_buffers_drafts_as_one_forward_does() {
    let Some(s) = setup() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_target_and_head(dir.path(), &gpu_head_spec(false, true), 35);
    let runner = |max_tokens: usize, max_logit_rows: usize| {
        let (host, head) = heads(dir.path(), true);
        let layout = host.kv_layout(NUM_BLOCKS, BLOCK as u64);
        let cache = Arc::new(Mutex::new(GpuKvCache::new(&s.gpu, 1, layout).unwrap()));
        let capacity = HeadCapacity {
            max_tokens,
            max_logit_rows,
            first_rows: 1,
        };
        let scratch = i64::from(SCRATCH) * BLOCK as i64;
        GpuHead::new(head, cache, capacity, scratch, 1024)
    };
    let (mut whole, mut cut) = (runner(256, 16), runner(16, 2));
    let mut rng = rng("a_catch_up_past_the_buffers_drafts_as_one_forward_does");
    let lens = [7usize, 12, 1, 30, 3];
    let tables: Vec<Vec<u32>> = (0..lens.len()).map(table).collect();
    let (specs, rows) = first_step(&lens, &tables);
    let total: usize = lens.iter().sum();
    let tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
    let aux = random_f32(&mut rng, total * whole.aux_width(), 2.0);
    let input = HeadInput::Aux(&aux);
    let want = whole.run(&specs, &tokens, input, &rows, true).unwrap();
    let got = cut.run(&specs, &tokens, input, &rows, true).unwrap();
    assert_eq!(got.greedy, want.greedy, "drafts");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.pre), bits(&want.pre), "pre");
    let (got, want) = (got.logits.unwrap(), want.logits.unwrap());
    assert_eq!(got.len(), rows.len() * whole.vocab().len());
    assert_eq!(bits(&got), bits(&want), "logits");
}
