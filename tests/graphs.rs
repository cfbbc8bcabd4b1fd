//! Captured CPU decode graphs: a replay equals the eager forward bit for bit at every
//! captured size after allocation churn, its padded rows write the scratch slot and nothing
//! else, its attention leaves the rows after the real ones alone, and recapturing on a
//! `max_num_seqs` reload loses no request in flight.

mod common;

use common::engine::{collect, requests, solo, submit, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::engine::{start_engine, EngineSettings};
use peregrine_actors::graphs::{CaptureSizes, CpuDecodeGraphs};
use peregrine_actors::messages::{FinishReason, SchedulerLimits, SchedulerMsg};
use peregrine_kernels::cpu::KvLayout;
use peregrine_models::{LlamaModel, StepInputs, StepShape, StepStaging};
use peregrine_ops::sampling::argmax;
use peregrine_ops::{AttentionPlan, KvCache, PagedAttention, SeqSpec, StagedMeta};
use tokio::sync::oneshot;

const BLOCK: usize = 16;
/// Blocks each test sequence owns (prompts of up to 20 tokens, then a few decode steps).
const SEQ_BLOCKS: usize = 2;

/// The tiny model, loaded from a fresh directory.
fn tiny(seed: u64) -> (tempfile::TempDir, LlamaModel) {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), seed).write_hf(dir.path());
    let model = LlamaModel::load(dir.path()).unwrap();
    (dir, model)
}

/// Sequence `i`'s blocks.
fn table(i: usize) -> Vec<u32> {
    (0..SEQ_BLOCKS)
        .map(|b| (i * SEQ_BLOCKS + b) as u32)
        .collect()
}

/// Plans sequences `(cached, new)` over their own blocks.
fn plan(seqs: &[(usize, usize)], num_blocks: u64) -> AttentionPlan {
    let tables: Vec<Vec<u32>> = (0..seqs.len()).map(table).collect();
    let specs: Vec<SeqSpec> = seqs
        .iter()
        .zip(&tables)
        .map(|(&(num_cached, num_new), t)| SeqSpec {
            num_cached,
            num_new,
            block_table: t,
        })
        .collect();
    AttentionPlan::new(&specs, BLOCK, num_blocks).unwrap()
}

/// Allocates and frees many buffers of every size the graphs use, written with garbage,
/// and runs eager forwards of every size: freed storage is then other buffers' storage.
fn churn(model: &LlamaModel, sizes: &CaptureSizes, layout: KvLayout) {
    let c = model.config();
    let widths = [
        1,
        c.hidden_size,
        c.vocab_size,
        c.intermediate_size,
        2 * c.intermediate_size,
    ];
    for &s in sizes.sizes() {
        let held: Vec<_> = widths
            .iter()
            .flat_map(|w| (0..4).map(move |_| s * w))
            .map(|len| model.pool().alloc::<f32>(len))
            .collect();
        held.iter().for_each(|b| b.write().fill(1.0e30));
        let mut scratch = model.new_cache(layout.num_blocks, layout.block_size);
        let p = plan(&vec![(0, 1); s], layout.num_blocks);
        let tokens = vec![7; s];
        let rows: Vec<usize> = (0..s).collect();
        model.forward(&tokens, &p, &mut scratch, &rows).unwrap();
    }
}

/// Whether the two caches hold the same bits outside block `scratch`, and whether that
/// block differs.
fn compare_caches(a: &KvCache, b: &KvCache, layers: usize, scratch: u64) -> (bool, bool) {
    let per_block = (a.layout().block_size * a.layout().slot_elems()) as usize;
    let at = scratch as usize * per_block;
    let (mut same_outside, mut scratch_differs) = (true, false);
    for l in 0..layers {
        let (ka, va) = a.layer(l);
        let (kb, vb) = b.layer(l);
        // A latent cache has no value cache.
        for (x, y) in [(ka, kb), (va, vb)]
            .into_iter()
            .filter(|(x, _)| !x.is_empty())
        {
            let bits = |s: &[f32]| s.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            same_outside &= bits(&x[..at]) == bits(&y[..at]);
            same_outside &= bits(&x[at + per_block..]) == bits(&y[at + per_block..]);
            scratch_differs |= bits(&x[at..at + per_block]) != bits(&y[at..at + per_block]);
        }
    }
    (same_outside, scratch_differs)
}

#[test]
fn replay_matches_eager_bit_for_bit_at_every_size_and_pads_into_the_scratch_slot_only() {
    let (_dir, model) = tiny(91);
    replay_matches_eager(&model);
}

/// The same for latent attention and a mixture of experts (the DeepSeek-V3 fixture).
#[test]
fn latent_attention_and_experts_replay_as_they_run_eagerly() {
    let dir = std::path::Path::new("tests/fixtures/deepseek/deepseek_v3");
    replay_matches_eager(&LlamaModel::load(dir).unwrap());
}

/// Replays at every captured size (after allocation churn) equal the eager forward bit for
/// bit, padded rows write the scratch block only, and steps past the largest size or not
/// pure decode are left to the eager forward.
fn replay_matches_eager(model: &LlamaModel) {
    let c = model.config().clone();
    let sizes = CaptureSizes::for_max_num_seqs(96);
    assert!(sizes.sizes().len() >= 12, "{:?}", sizes.sizes());
    let largest = sizes.largest();
    let scratch_block = (largest * SEQ_BLOCKS) as u64;
    let layout = model.kv_layout(scratch_block + 1, BLOCK as u64);
    let scratch_slot = (scratch_block * BLOCK as u64) as i64;
    let mut graphs = CpuDecodeGraphs::capture(model, &sizes, 4, scratch_slot, &[]).unwrap();
    churn(model, &sizes, layout);
    let mut previous = 0;
    for &size in sizes.sizes() {
        for n in [previous + 1, size] {
            let mut eager = model.new_cache(layout.num_blocks, layout.block_size);
            let mut replayed = model.new_cache(layout.num_blocks, layout.block_size);
            // Prompts of 3 to 19 tokens, prefilled eagerly into both caches.
            let lens: Vec<usize> = (0..n).map(|i| 3 + (i * 7) % 17).collect();
            let prompt: Vec<u32> = lens
                .iter()
                .flat_map(|&l| (0..l as u32).map(|t| 5 + t))
                .collect();
            let prefill: Vec<(usize, usize)> = lens.iter().map(|&l| (0, l)).collect();
            let p = plan(&prefill, layout.num_blocks);
            let last: Vec<usize> = lens
                .iter()
                .scan(0, |end, &l| {
                    *end += l;
                    Some(*end - 1)
                })
                .collect();
            let logits = model.forward(&prompt, &p, &mut eager, &last).unwrap();
            model.forward(&prompt, &p, &mut replayed, &last).unwrap();
            let mut tokens: Vec<u32> = logits
                .chunks(c.vocab_size)
                .map(|r| argmax(r).unwrap())
                .collect();
            let mut cached = lens.clone();
            for step in 0..2 {
                let decode: Vec<(usize, usize)> = cached.iter().map(|&k| (k, 1)).collect();
                let p = plan(&decode, layout.num_blocks);
                let rows: Vec<usize> = (0..n).collect();
                let want = model.forward(&tokens, &p, &mut eager, &rows).unwrap();
                let got = graphs
                    .replay(&tokens, &p, &rows, &mut replayed, c.vocab_size)
                    .unwrap()
                    .expect("a captured size holds the batch");
                assert_eq!(got.size, size, "batch {n}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&got.logits) == bits(&want),
                    "batch {n} padded to {size}, step {step}"
                );
                let (same, scratch_written) =
                    compare_caches(&eager, &replayed, c.num_layers, scratch_block);
                assert!(
                    same,
                    "batch {n} padded to {size}: a KV write outside the scratch block"
                );
                assert_eq!(scratch_written, n < size, "batch {n} padded to {size}");
                tokens = want
                    .chunks(c.vocab_size)
                    .map(|r| argmax(r).unwrap())
                    .collect();
                cached.iter_mut().for_each(|k| *k += 1);
            }
        }
        previous = size;
    }
    // Past the largest size, and a step that is not pure decode, run eagerly.
    let small = CaptureSizes::from_list(&[1, 2], 2).unwrap();
    let mut graphs = CpuDecodeGraphs::capture(model, &small, 4, scratch_slot, &[]).unwrap();
    let mut cache = model.new_cache(layout.num_blocks, layout.block_size);
    let p = plan(&[(0, 1); 3], layout.num_blocks);
    let past = graphs.replay(&[3; 3], &p, &[0, 1, 2], &mut cache, c.vocab_size);
    assert!(past.unwrap().is_none());
    let prefill = plan(&[(0, 2)], layout.num_blocks);
    let mixed = graphs.replay(&[3, 4], &prefill, &[1], &mut cache, c.vocab_size);
    assert!(mixed.unwrap().is_none());
}

#[test]
fn padded_attention_leaves_the_padded_rows_and_a_sentinel_tail_alone_at_every_size() {
    const SENTINEL: f32 = -12345.0;
    const TAIL: usize = 3;
    let (heads, kv_heads, d) = (4usize, 2u64, 16u64);
    let sizes = CaptureSizes::for_max_num_seqs(96);
    let largest = sizes.largest();
    let layout = KvLayout {
        num_blocks: (largest * SEQ_BLOCKS + 1) as u64,
        block_size: BLOCK as u64,
        num_kv_heads: kv_heads,
        head_dim: d,
    };
    let mut cache = KvCache::new(1, layout);
    let width = heads * d as usize;
    let k: Vec<f32> = (0..largest * 20 * (kv_heads * d) as usize)
        .map(|i| (i % 13) as f32 * 0.1)
        .collect();
    let all: Vec<i64> = (0..largest)
        .flat_map(|s| (0..20).map(move |t| (s * SEQ_BLOCKS * BLOCK + t) as i64))
        .collect();
    cache.write(0, &all, &k, &k);
    let op = PagedAttention {
        num_heads: heads,
        scale: 0.25,
    };
    let pool = peregrine_runtime::cpu::BufferPool::new();
    let scratch = ((largest * SEQ_BLOCKS) * BLOCK) as i64;
    let mut staging = StepStaging::new(StepShape::decode(largest), SEQ_BLOCKS, scratch).unwrap();
    let inputs = StepInputs::new(&pool, StepShape::decode(largest), SEQ_BLOCKS);
    let mut previous = 0;
    for &size in sizes.sizes() {
        let n = previous + 1;
        let p = plan(&vec![(9, 1); n], layout.num_blocks);
        let tokens = vec![1; n];
        let rows: Vec<usize> = (0..n).collect();
        staging
            .stage(&inputs, &tokens, &p, &rows, StepShape::decode(size))
            .unwrap();
        let (starts, lens, tables) = (
            inputs.query_start.read(),
            inputs.seq_lens.read(),
            inputs.block_tables.read(),
        );
        let meta = StagedMeta {
            query_start: &starts[..size + 1],
            seq_lens: &lens[..size],
            block_tables: &tables[..size * SEQ_BLOCKS],
            max_blocks: SEQ_BLOCKS,
        };
        // q and o of `size` rows, followed in memory by a sentinel tail.
        let q = vec![0.3f32; (size + TAIL) * width];
        let mut o = vec![SENTINEL; (size + TAIL) * width];
        op.forward_staged(&q[..size * width], &mut o[..size * width], &cache, 0, &meta)
            .unwrap();
        assert!(o[..n * width].iter().all(|&x| x != SENTINEL), "size {size}");
        assert!(
            o[n * width..].iter().all(|&x| x == SENTINEL),
            "size {size}: padded rows or tail written"
        );
        // The staged slot mapping sends every padded row to the scratch slot.
        let slots = inputs.slot_mapping.read();
        assert!(slots[n..size].iter().all(|&s| s == scratch), "size {size}");
        // A view of o shorter than the planned rows is refused before the kernel.
        let short = op.forward_staged(
            &q[..size * width],
            &mut o[..(n - 1) * width],
            &cache,
            0,
            &meta,
        );
        assert!(short.is_err(), "size {size}");
        previous = size;
    }
}

#[tokio::test]
async fn recapturing_on_a_max_num_seqs_reload_loses_no_request_in_flight() {
    const MAX_TOKENS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 92).write_hf(dir.path());
    let reqs = requests(300, 12, 9);
    let alone = solo(dir.path(), &reqs, MAX_TOKENS);
    let limits = |max_num_seqs| SchedulerLimits {
        max_num_seqs,
        max_num_batched_tokens: 64,
        max_waiting: 100,
        num_speculative_tokens: 0,
        speculative_adaptive: false,
    };
    let settings = EngineSettings {
        block_size: 16,
        prefix_caching: true,
        limits: limits(16),
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    let engine = start_engine(tiny_backend(dir.path(), 64), &settings, None).unwrap();
    assert_eq!(engine.num_blocks, 64, "the scratch block is nobody's");
    engine
        .graphs
        .capture(Some(CaptureSizes::for_max_num_seqs(16)))
        .await
        .unwrap();
    let mut streams = Vec::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        streams.push(submit(&engine.scheduler, i as u64, prompt, params, MAX_TOKENS).await);
    }
    // Wait for the first tokens, then reload max_num_seqs 16 -> 6 -> 24 while they run.
    let first = streams[0].recv().await.expect("a first event");
    for max_num_seqs in [6, 24] {
        let sizes = CaptureSizes::for_max_num_seqs(max_num_seqs);
        engine.graphs.capture(Some(sizes)).await.unwrap();
        let (reply, applied) = oneshot::channel();
        engine
            .scheduler
            .send(SchedulerMsg::Reconfigure(limits(max_num_seqs), reply))
            .await
            .unwrap();
        applied.await.unwrap();
    }
    // Dropping the graphs (enforce_eager) and capturing again loses nothing either.
    engine.graphs.capture(None).await.unwrap();
    engine
        .graphs
        .capture(Some(CaptureSizes::for_max_num_seqs(24)))
        .await
        .unwrap();
    let mut outputs = Vec::new();
    for rx in streams {
        outputs.push(collect(rx).await);
    }
    let peregrine_actors::messages::RequestEvent::Tokens(first) = first else {
        panic!("the first event was not tokens");
    };
    let mut first_tokens: Vec<u32> = first.iter().map(|t| t.id).collect();
    first_tokens.extend(&outputs[0].0);
    outputs[0].0 = first_tokens;
    for (i, (tokens, reason, usage)) in outputs.iter().enumerate() {
        assert_eq!(*reason, FinishReason::Length, "request {i}");
        assert_eq!(usage.completion_tokens, MAX_TOKENS, "request {i}");
        assert_eq!(tokens, &alone[i], "request {i}");
    }
}
