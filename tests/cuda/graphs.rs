//! CUDA graphs of the decode step against eager steps: every captured size replayed after
//! the allocator was churned, padded batches, sentinels after the graph buffers' q and o
//! rows, and the scratch slot that padded rows write; verification graphs (up to K + 1
//! rows a sequence) against eager verification forwards. Each for a tiny Llama and, where
//! the mode allows, for the DeepSeek-V3 fixture's latent attention and experts.

use crate::common::tiny_model::{TinyModel, TinySpec};
use crate::model::gpu_sized;
use crate::{random_f32, rng, setup};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::attention::DecodeKernel;
use peregrine_kernels::cuda::elementwise::fill_uniform;
use peregrine_kernels::GEMV_MAX_ROWS;
use peregrine_models::draft_head::cuda::hand_off::DraftHandOff;
use peregrine_models::draft_head::HandedDraft;
use peregrine_models::graph::cuda::GraphLimits;
use peregrine_models::llama::cuda::{GpuLlama, GpuModelOptions, GraphKind, GreedyInput, StepMasks};
use peregrine_ops::cuda::attention::{write_kv, DeviceAttentionPlan, GpuPagedAttention};
use peregrine_ops::cuda::plan::PlanCapacity;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::sampling::{accept_greedy, argmax, TokenMask};
use peregrine_ops::{AttentionPlan, KvRows, SeqSpec};
use peregrine_runtime::cuda::Gpu;
use rand::Rng;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// 1, 2, 4, 8 and every multiple of 8 up to 96: fifteen sizes.
fn sizes() -> Vec<usize> {
    let mut sizes = vec![1, 2, 4, 8];
    sizes.extend((16..=96).step_by(8));
    sizes
}

const BLOCK_SIZE: usize = 16;
/// Blocks per sequence: contexts up to 1,024 tokens, past one split partition (512).
const PER_SEQ: usize = 64;

struct Fixture {
    model: GpuLlama,
    eager_cache: GpuKvCache,
    graph_cache: Arc<Mutex<GpuKvCache>>,
    tables: Vec<Vec<u32>>,
    num_blocks: u64,
}

/// The model a graph test runs.
#[derive(Clone, Copy)]
enum Shape {
    /// A tiny random Llama (grouped-query attention, keys and values cached).
    Llama,
    /// The DeepSeek-V3 fixture: latent attention (one latent row cached a token) and a
    /// mixture of experts; its rotary table ends at 256 positions.
    Latent,
}

impl Shape {
    /// Prompt lengths of a long sequence: past one split partition of the grouped decode
    /// kernel for the Llama, as far as the rotary table leaves room for the latent model.
    fn long_prompt(self) -> std::ops::Range<usize> {
        match self {
            Shape::Llama => 520..900,
            Shape::Latent => 120..200,
        }
    }
}

/// A tiny model with both caches holding the same prompts of random lengths (some long)
/// for `seqs` sequences; returns the fixture and each sequence's (cached tokens, next token).
fn fixture(
    shape: Shape,
    deterministic: bool,
    seqs: usize,
    seed_name: &str,
) -> (Fixture, Vec<(usize, u32)>) {
    let s = setup().expect("a GPU");
    let dir = tempfile::tempdir().unwrap();
    let model_dir = match shape {
        Shape::Llama => {
            TinyModel::random(gpu_sized(TinySpec::llama_tiny()), 21).write_hf(dir.path());
            dir.path()
        }
        Shape::Latent => Path::new("tests/fixtures/deepseek/deepseek_v3"),
    };
    let options = GpuModelOptions {
        max_tokens: 4096,
        max_logit_rows: 128,
        deterministic,
        gemv_max_rows: GEMV_MAX_ROWS,
    };
    let mut model = GpuLlama::load(model_dir, s.gpu.clone(), s.kernels.clone(), options).unwrap();
    let c = model.config().clone();
    let vocab = c.vocab_size as u32;
    // One block past the sequences': the scratch block.
    let num_blocks = (seqs * PER_SEQ + 1) as u64;
    let mut eager_cache = model.new_cache(num_blocks, BLOCK_SIZE as u64).unwrap();
    let graph_cache = model.new_cache(num_blocks, BLOCK_SIZE as u64).unwrap();
    let graph_cache = Arc::new(Mutex::new(graph_cache));
    let mut rng = rng(seed_name);
    // Scattered tables: sequence s owns blocks s, s + seqs, s + 2 seqs, ...
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| (0..PER_SEQ).map(|i| (s + i * seqs) as u32).collect())
        .collect();
    let mut state = Vec::new();
    for (i, table) in tables.iter().enumerate() {
        // Every fourth sequence (from the fourth) past one split partition: batches of up
        // to three run the short-context graphs, larger ones the long.
        let len = if i % 4 == 3 {
            rng.random_range(shape.long_prompt())
        } else {
            rng.random_range(1..60usize)
        };
        let prompt: Vec<u32> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
        let spec = SeqSpec {
            num_cached: 0,
            num_new: len,
            block_table: table,
        };
        let plan = AttentionPlan::new(&[spec], BLOCK_SIZE, num_blocks).unwrap();
        let last = [len - 1];
        let a = model
            .forward_to_host(&prompt, &plan, &mut eager_cache, &last)
            .unwrap();
        let mut kv = graph_cache.lock().unwrap();
        let b = model
            .forward_to_host(&prompt, &plan, &mut kv, &last)
            .unwrap();
        assert_eq!(a, b, "the same prefill into both caches");
        state.push((len, rng.random_range(0..vocab)));
    }
    let f = Fixture {
        model,
        eager_cache,
        graph_cache,
        tables,
        num_blocks,
    };
    (f, state)
}

impl Fixture {
    fn limits(&self, max_rows: usize) -> GraphLimits {
        GraphLimits {
            max_rows,
            max_context: PER_SEQ * BLOCK_SIZE,
            scratch_slot: ((self.num_blocks - 1) * BLOCK_SIZE as u64) as i64,
        }
    }

    /// The decode plan of the first `n` sequences.
    fn plan(&self, state: &[(usize, u32)], n: usize) -> (Vec<u32>, AttentionPlan) {
        let specs: Vec<SeqSpec> = (0..n)
            .map(|s| SeqSpec {
                num_cached: state[s].0,
                num_new: 1,
                block_table: &self.tables[s],
            })
            .collect();
        let tokens = (0..n).map(|s| state[s].1).collect();
        let plan = AttentionPlan::new(&specs, BLOCK_SIZE, self.num_blocks).unwrap();
        (tokens, plan)
    }
}

/// Largest |a - b| over the logits' range.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let range =
        b.iter().fold(f32::MIN, |m, &x| m.max(x)) - b.iter().fold(f32::MAX, |m, &x| m.min(x));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / range
}

/// Captures every size, churns the allocator, then for every size replays a full batch and
/// a padded one (one row fewer) and compares logits and greedy tokens with eager steps
/// that write the eager cache. `deterministic`: a row's logits do not depend on the batch,
/// so padding changes no bit.
fn replay_matches_eager(shape: Shape, deterministic: bool, name: &str) {
    let s = setup().expect("a GPU");
    let largest = *sizes().last().unwrap();
    let (mut f, mut state) = fixture(shape, deterministic, largest, name);
    let limits = f.limits(largest);
    let mut graphs = Vec::new();
    for &size in sizes().iter().rev() {
        graphs.push(
            f.model
                .capture_decode(size, limits, &f.graph_cache)
                .unwrap(),
        );
    }
    graphs.reverse();
    assert!(graphs.len() >= 12);
    // Churn: many buffers of the graph buffers' sizes (and others) allocated and freed, so
    // that a graph reading freed memory would read someone else's data.
    let c = f.model.config().clone();
    for round in 0..50 {
        let bufs: Vec<_> = [
            largest,
            largest * c.hidden_size,
            largest * c.vocab_size,
            4096,
        ]
        .iter()
        .map(|&n| s.gpu.upload(&vec![f32::NAN; n + round]).unwrap())
        .collect();
        drop(bufs);
    }
    let vocab = c.vocab_size;
    for graph in &graphs {
        let size = graph.size();
        for n in [size, size - 1].into_iter().filter(|&n| n >= 1) {
            let (tokens, plan) = f.plan(&state, n);
            let rows: Vec<usize> = (0..n).collect();
            let eager = f
                .model
                .forward_to_host(&tokens, &plan, &mut f.eager_cache, &rows)
                .unwrap();
            let eager_ids: Vec<u32> = eager
                .chunks(vocab)
                .map(|row| peregrine_ops::sampling::argmax(row).unwrap())
                .collect();
            let replayed = graph.replay(&tokens, &plan).unwrap();
            let got = s.gpu.download(&replayed.logits()).unwrap();
            let ids = replayed.greedy_ids().unwrap();
            drop(replayed);
            if deterministic {
                assert!(
                    got == eager,
                    "size {size}, {n} rows: logits differ from eager"
                );
                assert_eq!(ids, eager_ids, "size {size}, {n} rows");
            } else {
                let err = relative_error(&got, &eager);
                assert!(
                    err < 0.02,
                    "size {size}, {n} rows: error {err} of the range"
                );
            }
            // Both caches advanced by the same step; the next step feeds eager's tokens.
            for (s, id) in state.iter_mut().take(n).zip(&eager_ids) {
                *s = (s.0 + 1, *id);
            }
        }
    }
    // The caches agree in every block a sequence owns (deterministic mode: bit for bit);
    // no eager step wrote the scratch block. A latent cache has no value tensor.
    let kv = f.graph_cache.lock().unwrap();
    let block = BLOCK_SIZE * kv.layout().slot_elems() as usize;
    let tensors = match kv.rows() {
        KvRows::KeysAndValues => 2,
        KvRows::Latent => 1,
    };
    for layer in 0..c.num_layers {
        let (graphed, eager) = (kv.layer(layer), f.eager_cache.layer(layer));
        for (a, b) in [(graphed.0, eager.0), (graphed.1, eager.1)]
            .into_iter()
            .take(tensors)
        {
            let (a, b) = (s.gpu.download(a).unwrap(), s.gpu.download(b).unwrap());
            let (owned, scratch) = a.split_at(a.len() - block);
            let (owned_eager, scratch_eager) = b.split_at(b.len() - block);
            if deterministic {
                assert!(
                    owned == owned_eager,
                    "layer {layer}: the sequences' KV differs"
                );
            }
            assert!(scratch_eager.iter().all(|v| v.to_f32() == 0.0));
            // Capture runs its step over the scratch block, and padded rows write there
            // (deterministic mode) or nowhere (the attention launch writes the real rows').
            assert!(
                scratch.iter().any(|v| v.to_f32() != 0.0),
                "layer {layer}: the capture did not write the scratch block"
            );
        }
    }
}

#[test]
fn decode_graphs_replay_like_eager_steps_at_every_size_deterministic() {
    if setup().is_none() {
        return;
    }
    replay_matches_eager(
        Shape::Llama,
        true,
        "decode_graphs_replay_like_eager_steps_at_every_size_deterministic",
    );
}

#[test]
fn decode_graphs_replay_like_eager_steps_at_every_size() {
    if setup().is_none() {
        return;
    }
    replay_matches_eager(
        Shape::Llama,
        false,
        "decode_graphs_replay_like_eager_steps_at_every_size",
    );
}

/// The same for latent attention and a mixture of experts (DeepSeek-V3): fifteen sizes,
/// churned, every one replayed full and padded against eager steps, its padded rows
/// writing the scratch block only.
#[test]
fn latent_decode_graphs_replay_like_eager_steps_at_every_size() {
    if setup().is_none() {
        return;
    }
    replay_matches_eager(
        Shape::Latent,
        false,
        "latent_decode_graphs_replay_like_eager_steps_at_every_size",
    );
}

/// Verification graphs of 4, 8, 16 and 32 rows replay steps of sequences of 1 to 4 rows
/// each (the last token and up to 3 drafts), filling each graph or padding it, as eager
/// verification forwards do: the same logits bit for bit and the same KV in every block a
/// sequence owns in deterministic mode, within bf16 error otherwise.
///
/// With `fed`, every draft reaches the graph from a [`DraftHandOff`] written on another
/// stream behind a long fill (the host's tokens there are other tokens): a replay that did
/// not wait for the write, or fed the wrong rows, gives other logits.
fn verify_replay_matches_eager(shape: Shape, deterministic: bool, fed: bool, name: &str) {
    let s = setup().expect("a GPU");
    let head = Gpu::open(0).unwrap();
    let hand_off = DraftHandOff::new(&s.gpu, 64).unwrap();
    let mut busy = head.zeros::<bf16>(1 << 27).unwrap();
    let (most_rows, seqs) = (32usize, 8usize);
    let (mut f, mut state) = fixture(shape, deterministic, seqs, name);
    let limits = GraphLimits {
        max_rows: most_rows,
        ..f.limits(most_rows)
    };
    let graphs: Vec<_> = [32, 16, 8, 4]
        .into_iter()
        .map(|rows| {
            f.model
                .capture_verify(rows, limits, &f.graph_cache)
                .unwrap()
        })
        .collect();
    let vocab = f.model.config().vocab_size;
    let mut rng = rng(name);
    for graph in graphs.iter().rev() {
        let size = graph.size();
        assert_eq!(graph.kind(), GraphKind::Verify);
        for round in 0..3 {
            // Sequences of 1 to 4 rows while they fit the graph: the first round as many
            // as fit, the others fewer (padded).
            let mut q_lens = Vec::new();
            while q_lens.len() < seqs {
                let q = rng.random_range(1..=4usize);
                if q_lens.iter().sum::<usize>() + q > size {
                    break;
                }
                q_lens.push(q);
                if round > 0 && rng.random_bool(0.3) {
                    break;
                }
            }
            if q_lens.is_empty() {
                q_lens.push(1);
            }
            let specs: Vec<SeqSpec> = q_lens
                .iter()
                .enumerate()
                .map(|(i, &q)| SeqSpec {
                    num_cached: state[i].0,
                    num_new: q,
                    block_table: &f.tables[i],
                })
                .collect();
            let tokens: Vec<u32> = q_lens
                .iter()
                .enumerate()
                .flat_map(|(i, &q)| {
                    let drafts: Vec<u32> =
                        (1..q).map(|_| rng.random_range(0..vocab as u32)).collect();
                    std::iter::once(state[i].1).chain(drafts)
                })
                .collect();
            let plan = AttentionPlan::new(&specs, BLOCK_SIZE, f.num_blocks).unwrap();
            let rows: Vec<usize> = (0..tokens.len()).collect();
            let eager = f
                .model
                .forward_to_host(&tokens, &plan, &mut f.eager_cache, &rows)
                .unwrap();
            let feeds = fed && q_lens.iter().any(|&q| q > 1);
            let mut replayed = match feeds {
                false => graph.replay(&tokens, &plan).unwrap(),
                true => {
                    let (placeholders, drafts, rows) = drafts_of(&tokens, &q_lens, vocab);
                    let k = &s.kernels;
                    fill_uniform(k, head.stream(), &mut busy.as_view_mut(), round as u64, 1.0)
                        .unwrap();
                    let on_head = head.upload(&drafts).unwrap();
                    let generation = hand_off.write(head.stream(), &on_head.as_view()).unwrap();
                    let fed: Vec<(usize, HandedDraft)> = rows
                        .iter()
                        .enumerate()
                        .map(|(index, &row)| (row, HandedDraft { generation, index }))
                        .collect();
                    let replayed = graph.replay_fed(&placeholders, &plan, &hand_off, &fed);
                    let which: Vec<HandedDraft> = fed.iter().map(|&(_, d)| d).collect();
                    let back = hand_off.fetch(s.gpu.stream(), &which).unwrap();
                    let want: Vec<u32> = drafts.iter().map(|&d| d as u32).collect();
                    assert_eq!(back, want, "the drafts fed, read back");
                    replayed.unwrap()
                }
            };
            let got = s.gpu.download(&replayed.logits()).unwrap();
            let ids = replayed.greedy_ids().unwrap();
            if feeds {
                // The verdicts judged on the device: the ids again, and each sequence's
                // accepted drafts as the host judges them from the real drafts.
                let mut starts = vec![0];
                for &q in &q_lens {
                    starts.push(starts.last().unwrap() + q);
                }
                let (again, accepted) = replayed.greedy_verdicts(&starts).unwrap();
                assert_eq!(again, ids, "the verdicts' ids");
                let want: Vec<usize> = starts
                    .windows(2)
                    .map(|w| accept_greedy(&ids[w[0]..w[1]], &tokens[w[0] + 1..w[1]]).accepted)
                    .collect();
                assert_eq!(accepted, want, "graph of {size} rows, {q_lens:?}: verdicts");
                let bad = replayed.greedy_verdicts(&[0, 1]);
                assert!(bad.is_err(), "offsets short of the step's rows");
            }
            drop(replayed);
            let eager_ids: Vec<u32> = eager
                .chunks(vocab)
                .map(|row| peregrine_ops::sampling::argmax(row).unwrap())
                .collect();
            let what = format!("graph of {size} rows, sequences of {q_lens:?} rows");
            if deterministic {
                assert!(got == eager, "{what}: logits differ");
                assert_eq!(ids, eager_ids, "{what}");
            } else {
                let err = relative_error(&got, &eager);
                assert!(err < 0.02, "{what}: error {err}");
            }
            // Every draft accepted: the next step starts after them.
            let mut end = 0;
            for (st, &q) in state.iter_mut().zip(&q_lens) {
                end += q;
                *st = (st.0 + q, eager_ids[end - 1]);
            }
        }
    }
    if deterministic {
        let kv = f.graph_cache.lock().unwrap();
        let block = BLOCK_SIZE * kv.layout().slot_elems() as usize;
        for layer in 0..f.model.config().num_layers {
            for (a, b) in [
                (kv.layer(layer).0, f.eager_cache.layer(layer).0),
                (kv.layer(layer).1, f.eager_cache.layer(layer).1),
            ] {
                let (a, b) = (s.gpu.download(a).unwrap(), s.gpu.download(b).unwrap());
                let owned = a.len() - block;
                assert!(
                    a[..owned] == b[..owned],
                    "layer {layer}: the sequences' KV differs"
                );
            }
        }
    }
}

#[test]
fn verification_graphs_replay_like_eager_verification_deterministic() {
    if setup().is_none() {
        return;
    }
    verify_replay_matches_eager(
        Shape::Llama,
        true,
        false,
        "verification_graphs_deterministic",
    );
}

/// Drafts fed into verification graphs from the device (a draft head's hand-off, written on
/// another stream), against eager verification forwards of the same tokens from the host.
#[test]
fn verification_graphs_fed_drafts_on_the_device_replay_as_from_the_host() {
    if setup().is_none() {
        return;
    }
    verify_replay_matches_eager(Shape::Llama, true, true, "verification_graphs_fed");
}

/// The tokens of a verification step of sequences of `q_lens` rows (the last token, then
/// drafts) with every draft replaced by another token of `vocab`; the drafts; and the
/// rows they lie at.
fn drafts_of(tokens: &[u32], q_lens: &[usize], vocab: usize) -> (Vec<u32>, Vec<i32>, Vec<usize>) {
    let (mut placeholders, mut drafts, mut rows) = (tokens.to_vec(), Vec::new(), Vec::new());
    let mut start = 0;
    for &q in q_lens {
        for row in start + 1..start + q {
            drafts.push(tokens[row] as i32);
            rows.push(row);
            placeholders[row] = (tokens[row] + 1) % vocab as u32;
        }
        start += q;
    }
    (placeholders, drafts, rows)
}

#[test]
fn verification_graphs_replay_like_eager_verification() {
    if setup().is_none() {
        return;
    }
    verify_replay_matches_eager(Shape::Llama, false, false, "verification_graphs");
}

/// Verification graphs of the latent model (DeepSeek-V3), whose plans cut every sequence
/// into one-row sequences, padded and full, against eager verification forwards.
#[test]
fn latent_verification_graphs_replay_like_eager_verification() {
    if setup().is_none() {
        return;
    }
    verify_replay_matches_eager(Shape::Latent, false, false, "latent_verification_graphs");
}

/// Sentinel bits no kernel writes.
fn sentinel() -> bf16 {
    bf16::from_f32(-12345.0)
}

#[test]
fn a_padded_graph_plan_leaves_the_sentinels_and_writes_padding_to_the_scratch_slot_only() {
    let Some(s) = setup() else { return };
    let mut rng =
        rng("a_padded_graph_plan_leaves_the_sentinels_and_writes_padding_to_the_scratch_slot_only");
    let (heads, kv_heads, d) = (4usize, 2usize, 64usize);
    let (width, kv_width) = (heads * d, kv_heads * d);
    let stride = width + 2 * kv_width;
    let largest = *sizes().last().unwrap();
    // Contexts up to 1,280 tokens: both context classes of the split kernel.
    let per_seq = 80usize;
    let num_blocks = (largest * per_seq + 1) as u64;
    let layout = KvLayout {
        num_blocks,
        block_size: BLOCK_SIZE as u64,
        num_kv_heads: kv_heads as u64,
        head_dim: d as u64,
    };
    let scratch_block = num_blocks - 1;
    let capacity = PlanCapacity {
        rows: largest,
        decode_only: true,
        max_context: per_seq * BLOCK_SIZE,
        block_size: BLOCK_SIZE,
        scratch_slot: (scratch_block * BLOCK_SIZE as u64) as i64,
    };
    let attention = GpuPagedAttention {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: d,
        scale: 0.125,
    };
    let stream = s.gpu.stream();
    for decode in [DecodeKernel::Split, DecodeKernel::Prefill] {
        let mut fixed = DeviceAttentionPlan::fixed(&s.gpu, decode, capacity, heads, d).unwrap();
        // A pool of random values, so that a read of a wrong slot reads wrong data.
        let cache: Vec<bf16> = random_f32(&mut rng, layout.layer_elems() as usize, 1.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        for size in sizes() {
            let n = size.div_ceil(2);
            let tables: Vec<Vec<u32>> = (0..n)
                .map(|q| (0..per_seq).map(|i| (q + i * largest) as u32).collect())
                .collect();
            // Short contexts at even sizes, some long ones at odd.
            let longest = if size % 2 == 0 {
                500
            } else {
                per_seq * BLOCK_SIZE - 1
            };
            let specs: Vec<SeqSpec> = tables
                .iter()
                .map(|t| SeqSpec {
                    num_cached: rng.random_range(0..longest),
                    num_new: 1,
                    block_table: t,
                })
                .collect();
            let class = if size % 2 == 0 {
                512
            } else {
                capacity.max_context
            };
            let plan = AttentionPlan::new(&specs, BLOCK_SIZE, num_blocks).unwrap();
            // q with every padded row random too, then a sentinel tail; o poisoned over the
            // real rows, sentinels over the padded rows and the tail.
            let mut qkv: Vec<bf16> = random_f32(&mut rng, size * stride, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            qkv.extend(vec![sentinel(); 8 * stride]);
            let mut o = vec![bf16::NAN; n * width];
            o.extend(vec![sentinel(); (size - n + 8) * width]);
            let run = |plan: &DeviceAttentionPlan, rows: usize| {
                let mut qkv_dev = s.gpu.upload(&qkv).unwrap();
                let mut o_dev = s.gpu.upload(&o).unwrap();
                let mut k = s.gpu.upload(&cache).unwrap();
                let mut v = s.gpu.upload(&cache).unwrap();
                let qkv_rows = &mut qkv_dev.slice_mut(0..rows * stride);
                write_kv(
                    &s.kernels, stream, qkv_rows, stride, heads, None, &mut k, &mut v, &layout,
                    plan,
                )
                .unwrap();
                let q = qkv_dev.slice(0..rows * stride);
                let o_rows = &mut o_dev.slice_mut(0..rows * width);
                attention
                    .forward(
                        &s.kernels, stream, &q, stride, &mut k, &mut v, &layout, plan, o_rows,
                    )
                    .unwrap();
                let all = |b| s.gpu.download(b).unwrap();
                (all(&o_dev), all(&k), all(&v))
            };
            let (tokens, rows) = (vec![0u32; n], (0..n).collect::<Vec<_>>());
            fixed
                .stage_padded(&tokens, &plan, &rows, size, class)
                .unwrap();
            let (o_graph, k_graph, v_graph) = run(&fixed, size);
            let eager = DeviceAttentionPlan::upload(&s.gpu, &plan, decode).unwrap();
            let (o_eager, k_eager, v_eager) = run(&eager, n);
            let bits = |x: &[bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&o_graph[..n * width]),
                bits(&o_eager[..n * width]),
                "size {size}: real rows"
            );
            assert!(
                o_graph[n * width..]
                    .iter()
                    .all(|v| v.to_bits() == sentinel().to_bits()),
                "size {size}: a padded row or the tail of o was written"
            );
            // Every slot but the scratch slot as the eager step left it; the scratch slot
            // written when a row was padded.
            let slot = layout.slot_elems() as usize;
            let at = capacity.scratch_slot as usize * slot;
            for (graph, eager) in [(&k_graph, &k_eager), (&v_graph, &v_eager)] {
                assert_eq!(bits(&graph[..at]), bits(&eager[..at]), "size {size}");
                assert_eq!(
                    bits(&graph[at + slot..]),
                    bits(&eager[at + slot..]),
                    "size {size}"
                );
                let written = bits(&graph[at..at + slot]) != bits(&eager[at..at + slot]);
                assert_eq!(written, size > n, "size {size}: the scratch slot");
            }
        }
    }
}

/// Each sequence of `state` (its cached tokens and its last token) one position further,
/// fed its token of `ids`.
fn advance(state: &mut [(usize, u32)], ids: &[u32]) {
    for (s, &id) in state.iter_mut().zip(ids) {
        *s = (s.0 + 1, id);
    }
}

/// Greedy decode steps queued ahead (each step queues the next through the same graph,
/// its tokens copied on the device from this step's argmax) give the tokens of the same
/// steps replayed one by one with their tokens through the host, padded sizes included;
/// a queued step is read only through its own graph, only while no other step ran over
/// the graphs' buffers, and only after a step of the same rows.
#[test]
fn decode_steps_queued_ahead_give_the_tokens_of_steps_replayed_one_by_one() {
    if setup().is_none() {
        return;
    }
    const STEPS: usize = 6;
    let (mut f, state) = fixture(Shape::Llama, false, 8, "ahead");
    let limits = f.limits(8);
    let graphs: Vec<_> = [8, 4, 1]
        .iter()
        .map(|&size| {
            f.model
                .capture_decode(size, limits, &f.graph_cache)
                .unwrap()
        })
        .collect();
    for (graph, n) in graphs.iter().zip([7, 3, 1]) {
        let mut replayed = Vec::new();
        let mut st = state.clone();
        for _ in 0..STEPS {
            let (tokens, plan) = f.plan(&st, n);
            let ids = graph.replay(&tokens, &plan).unwrap().greedy_ids().unwrap();
            advance(&mut st, &ids);
            replayed.push(ids);
        }
        let mut ahead = Vec::new();
        let mut st = state.clone();
        let mut queued = None;
        for step in 0..STEPS {
            let (tokens, plan) = f.plan(&st, n);
            let input = match queued.take() {
                Some(q) => GreedyInput::Queued(q),
                None => GreedyInput::Host {
                    tokens: &tokens,
                    plan: &plan,
                },
            };
            let mut following = st.clone();
            advance(&mut following, &vec![0; n]);
            let next = (step + 1 < STEPS).then(|| f.plan(&following, n).1);
            let (ids, q) = graph.greedy_step(input, next.as_ref(), None).unwrap();
            assert_eq!(q.is_some(), next.is_some(), "size {}", graph.size());
            queued = q;
            advance(&mut st, &ids);
            ahead.push(ids);
        }
        assert_eq!(ahead, replayed, "size {}, {n} rows", graph.size());
    }
    // What may not be read: a step another step followed, a step through another graph,
    // and a next step of other rows.
    let (tokens, plan) = f.plan(&state, 3);
    let input = GreedyInput::Host {
        tokens: &tokens,
        plan: &plan,
    };
    let next = f.plan(&state, 3).1;
    let (_, q) = graphs[1].greedy_step(input, Some(&next), None).unwrap();
    drop(graphs[1].replay(&tokens, &plan).unwrap());
    let stale = graphs[1].greedy_step(GreedyInput::Queued(q.unwrap()), None, None);
    assert!(
        stale.is_err(),
        "a step read after another step overwrote it"
    );
    let input = GreedyInput::Host {
        tokens: &tokens,
        plan: &plan,
    };
    let (_, q) = graphs[1].greedy_step(input, Some(&next), None).unwrap();
    let elsewhere = graphs[0].greedy_step(GreedyInput::Queued(q.unwrap()), None, None);
    assert!(elsewhere.is_err(), "a step read through another graph");
    let input = GreedyInput::Host {
        tokens: &tokens,
        plan: &plan,
    };
    let fewer = f.plan(&state, 2).1;
    assert!(graphs[1].greedy_step(input, Some(&fewer), None).is_err());
}

/// Greedy decode steps queued ahead under grammar masks (two rows of three masked, one
/// free, one step with no mask at all; a third of the vocabulary allowed): each row's
/// token is the argmax of its logits among what its mask allows, as the host finds it
/// over the same steps replayed one by one, and the step queued after it is fed that
/// token, padded graph rows included.
#[test]
fn masked_decode_steps_queued_ahead_take_the_masked_argmax() {
    if setup().is_none() {
        return;
    }
    const STEPS: usize = 6;
    const ROWS: usize = 3;
    let (mut f, state) = fixture(Shape::Llama, false, 8, "ahead-masked");
    let limits = f.limits(8);
    let graph = f.model.capture_decode(4, limits, &f.graph_cache).unwrap();
    let vocab = f.model.config().vocab_size;
    let mut r = rng("masked_decode_steps_queued_ahead_take_the_masked_argmax");
    let masks: Vec<Vec<Option<TokenMask>>> = (0..STEPS)
        .map(|step| {
            (0..ROWS)
                .map(|row| {
                    let allowed: Vec<u32> =
                        (0..vocab as u32).filter(|_| r.random_bool(0.3)).collect();
                    (row != 1 && step != 2).then(|| TokenMask::allowing(allowed, vocab))
                })
                .collect()
        })
        .collect();
    let mut replayed = Vec::new();
    let mut st = state.clone();
    for step_masks in &masks {
        let (tokens, plan) = f.plan(&st, ROWS);
        let logits = {
            let r = graph.replay(&tokens, &plan).unwrap();
            f.model.gpu().download(&r.logits()).unwrap()
        };
        let ids: Vec<u32> = logits
            .chunks(vocab)
            .zip(step_masks)
            .map(|(row, mask)| match mask {
                Some(mask) => argmax(&mask.applied(row)).unwrap(),
                None => argmax(row).unwrap(),
            })
            .collect();
        for (id, mask) in ids.iter().zip(step_masks) {
            assert!(mask.as_ref().is_none_or(|m| m.allows(*id)));
        }
        advance(&mut st, &ids);
        replayed.push(ids);
    }
    let mut ahead = Vec::new();
    let mut st = state.clone();
    let mut queued = None;
    for (step, step_masks) in masks.iter().enumerate() {
        let (tokens, plan) = f.plan(&st, ROWS);
        let input = match queued.take() {
            Some(q) => GreedyInput::Queued(q),
            None => GreedyInput::Host {
                tokens: &tokens,
                plan: &plan,
            },
        };
        let mut following = st.clone();
        advance(&mut following, &[0; ROWS]);
        let next = (step + 1 < STEPS).then(|| f.plan(&following, ROWS).1);
        let wait: StepMasks = Box::new(move || Ok(step_masks.clone()));
        let (ids, q) = graph.greedy_step(input, next.as_ref(), Some(wait)).unwrap();
        assert_eq!(q.is_some(), next.is_some());
        queued = q;
        advance(&mut st, &ids);
        ahead.push(ids);
    }
    assert_eq!(ahead, replayed);
    // Masks for other rows than the step's are refused.
    let (tokens, plan) = f.plan(&state, ROWS);
    let input = GreedyInput::Host {
        tokens: &tokens,
        plan: &plan,
    };
    let wrong: StepMasks = Box::new(|| Ok(vec![None; ROWS + 1]));
    assert!(graph.greedy_step(input, None, Some(wrong)).is_err());
}
