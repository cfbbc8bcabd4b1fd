//! The feature ring that hands the target's recorded layer inputs to an EAGLE-3 head on the
//! device: rows stored on one stream (the target's) and gathered on another (the head's)
//! come back as the host's bf16 rounding of the values stored, across the ring's wrap and
//! in any order; rows overwritten are refused; and a head fed rows of the ring drafts bit
//! for bit as one fed the same features from the host, through one forward and through a
//! catch-up cut into forwards its buffers hold; and a decode-shaped step 0 replayed through
//! a graph of step 0 drafts bit for bit as the eager step does.

use crate::eagle3::write_target_and_head;
use crate::eagle3::{blocks, first_step, gpu_head_spec, heads, ring_runner, table};
use crate::eagle3::{BLOCK, NUM_BLOCKS, SCRATCH};
use crate::{random_f32, rng, setup, to_bf16};
use half::bf16;
use peregrine_actors::draft::{GpuHead, HeadCapacity, HeadRunner};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_models::eagle3::feature_ring::{FeatureRing, RingError};
use peregrine_models::eagle3::HeadInput;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_ops::SeqSpec;
use peregrine_runtime::cuda::Gpu;
use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::{Arc, Mutex};

/// Stores `rows` rows of `values` (`[rows, width]`) into `ring` on `target`'s stream, in
/// chunks of `chunk` rows, and returns the number of the first.
fn store(ring: &FeatureRing, target: &Gpu, values: &[f32], rows: usize, chunk: usize) -> u64 {
    let s = setup().unwrap();
    let width = ring.width();
    let mut first = None;
    for start in (0..rows).step_by(chunk) {
        let end = (start + chunk).min(rows);
        let src = target.upload(&values[start * width..end * width]).unwrap();
        let at = ring
            .store(&s.kernels, target.stream(), &src.as_view(), end - start)
            .unwrap();
        first.get_or_insert(at);
        // The source may go once the store is queued and done.
        target.synchronize().unwrap();
    }
    first.unwrap()
}

#[test]
fn rows_stored_on_one_stream_are_gathered_on_another_across_the_wrap() {
    let Some(s) = setup() else {
        return;
    };
    let target = Gpu::open(0).unwrap();
    let mut rng = rng("rows_stored_on_one_stream_are_gathered_on_another_across_the_wrap");
    // An odd width and a capacity that the stores wrap past twice.
    let (width, capacity) = (37, 23);
    let ring = FeatureRing::new(&target, capacity, width).unwrap();
    let junk = random_f32(&mut rng, 40 * width, 3.0);
    let junk_first = store(&ring, &target, &junk, 40, 7);
    assert_eq!(junk_first, 0);
    let rows = 20;
    let values = random_f32(&mut rng, rows * width, 3.0);
    let first = store(&ring, &target, &values, rows, 6);
    assert_eq!(first, 40);
    // Rows 37..60 are held; 36 was overwritten by row 59.
    assert!(ring.holds(37) && ring.holds(59));
    assert!(!ring.holds(36) && !ring.holds(60));
    let mut order: Vec<usize> = (0..rows).collect();
    order.shuffle(&mut rng);
    let ids: Vec<u64> = order.iter().map(|&r| first + r as u64).collect();
    let mut slots = s.gpu.zeros::<i32>(rows).unwrap();
    // Poisoned: a row the gather missed reads NaN.
    let mut out = s.gpu.upload(&vec![bf16::NAN; (rows + 2) * width]).unwrap();
    ring.gather(&s.kernels, s.gpu.stream(), &ids, &mut slots, &mut out)
        .unwrap();
    let got = s.gpu.download(&out).unwrap();
    let want: Vec<bf16> = order
        .iter()
        .flat_map(|&r| to_bf16(&values[r * width..(r + 1) * width]))
        .collect();
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got[..rows * width]), bits(&want), "gathered rows");
    assert!(
        got[rows * width..].iter().all(|v| v.is_nan()),
        "past the rows"
    );
    // A row a later store overwrote is refused, and so is one not stored yet.
    for row in [36, 60] {
        let err = ring.gather(&s.kernels, s.gpu.stream(), &[row], &mut slots, &mut out);
        assert!(
            matches!(err, Err(RingError::NotHeld { row: r, oldest: 37, next: 60 }) if r == row),
            "row {row}: {err:?}"
        );
    }
    // A store of more rows than the ring holds is refused before anything is queued.
    let big = target
        .upload(&random_f32(&mut rng, 24 * width, 1.0))
        .unwrap();
    let err = ring.store(&s.kernels, target.stream(), &big.as_view(), 24);
    assert!(
        matches!(err, Err(RingError::Room { rows: 24, room: 23 })),
        "{err:?}"
    );
    assert!(ring.holds(59) && !ring.holds(60));
}

#[test]
fn a_head_fed_rows_of_the_ring_drafts_as_one_fed_host_features() {
    let Some(s) = setup() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_target_and_head(dir.path(), &gpu_head_spec(false, true), 41);
    let target = Gpu::open(0).unwrap();
    let runner = |max_tokens: usize, max_logit_rows: usize, ring: Option<Arc<FeatureRing>>| {
        let (host, mut head) = heads(dir.path(), true);
        if let Some(ring) = ring {
            head.read_features_from(ring).unwrap();
        }
        let layout = host.kv_layout(NUM_BLOCKS, BLOCK as u64);
        let cache = Arc::new(Mutex::new(GpuKvCache::new(&s.gpu, 1, layout).unwrap()));
        let capacity = HeadCapacity {
            max_tokens,
            max_logit_rows,
            first_rows: 4,
        };
        let scratch = i64::from(SCRATCH) * BLOCK as i64;
        GpuHead::new(head, cache, capacity, scratch, 1024)
    };
    let mut host_fed = runner(256, 16, None);
    let width = host_fed.aux_width();
    let ring = Arc::new(FeatureRing::new(&target, 64, width).unwrap());
    let (mut ring_fed, mut cut) = (
        runner(256, 16, Some(ring.clone())),
        runner(16, 2, Some(ring.clone())),
    );
    assert!(!host_fed.holds_ring_row(0));
    let mut rng = rng("a_head_fed_rows_of_the_ring_drafts_as_one_fed_host_features");
    let lens = [7usize, 12, 1, 20, 3];
    let tables: Vec<Vec<u32>> = (0..lens.len()).map(table).collect();
    let (specs, rows) = first_step(&lens, &tables);
    let total: usize = lens.iter().sum();
    let tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
    // The ring wraps inside the step's rows.
    store(
        &ring,
        &target,
        &random_f32(&mut rng, 50 * width, 2.0),
        50,
        25,
    );
    let aux = random_f32(&mut rng, total * width, 2.0);
    let first = store(&ring, &target, &aux, total, 9);
    let ids: Vec<u64> = (first..first + total as u64).collect();
    // 93 rows stored: 29.. are held.
    assert!(ring_fed.holds_ring_row(29) && !ring_fed.holds_ring_row(28));
    let want = host_fed
        .run(&specs, &tokens, HeadInput::Aux(&aux), &rows, true)
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (what, head) in [("one forward", &mut ring_fed), ("cut", &mut cut)] {
        let got = head
            .run(&specs, &tokens, HeadInput::Ring(&ids), &rows, true)
            .unwrap();
        assert_eq!(got.greedy, want.greedy, "{what}: drafts");
        assert_eq!(bits(&got.pre), bits(&want.pre), "{what}: pre");
        let (got, want) = (got.logits.unwrap(), want.logits.as_ref().unwrap());
        assert_eq!(bits(&got), bits(want), "{what}: logits");
    }
    // A head that reads no ring refuses ring rows.
    let err = host_fed.run(&specs, &tokens, HeadInput::Ring(&ids), &rows, false);
    assert!(err.is_err());
}

/// Deterministic mode: after the same prompts' step 0 (eager: past the graphs' rows a
/// sequence), a step 0 of 1 to 4 rows a sequence (14 rows; the graphs of step 0 hold 4, 8,
/// 16 and 32, so it pads) replayed through a graph gives exactly the eager step's drafts
/// and `pre`, and writes every block as the eager step does but the scratch block, which
/// only its padded rows wrote.
#[test]
fn a_decode_shaped_step_0_through_a_graph_drafts_as_the_eager_step() {
    let Some(_) = setup() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_target_and_head(dir.path(), &gpu_head_spec(false, true), 43);
    let target = Gpu::open(0).unwrap();
    let (host, _) = heads(dir.path(), true);
    let width = host.aux_layers().len() * host.config().target_hidden_size;
    let ring = Arc::new(FeatureRing::new(&target, 256, width).unwrap());
    let runner = || ring_runner(dir.path(), &ring);
    let ((mut eager, eager_cache), (mut graphed, graph_cache)) = (runner(), runner());
    graphed
        .capture_graphs(Some(&CaptureSizes::from_list(&[1, 2, 4, 8], 8).unwrap()))
        .unwrap();
    let scratch_before = blocks(&graph_cache.lock().unwrap())[SCRATCH as usize].clone();
    let mut rng = rng("a_decode_shaped_step_0_through_a_graph_drafts_as_the_eager_step");
    let lens = [7usize, 12, 5, 20, 9];
    let tables: Vec<Vec<u32>> = (0..lens.len()).map(table).collect();
    let (specs, rows) = first_step(&lens, &tables);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (step, news) in [lens.to_vec(), vec![1, 4, 2, 3, 4]].into_iter().enumerate() {
        let (specs, rows) = match step {
            0 => (specs.clone(), rows.clone()),
            _ => {
                let specs: Vec<SeqSpec> = specs
                    .iter()
                    .zip(&news)
                    .map(|(s, &n)| SeqSpec {
                        num_cached: s.num_new,
                        num_new: n,
                        block_table: s.block_table,
                    })
                    .collect();
                let (_, rows) = first_step(&news, &tables);
                (specs, rows)
            }
        };
        let total: usize = news.iter().sum();
        let tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
        let aux = random_f32(&mut rng, total * width, 2.0);
        let first = store(&ring, &target, &aux, total, total);
        let ids: Vec<u64> = (first..first + total as u64).collect();
        let input = HeadInput::Ring(&ids);
        let want = eager.run(&specs, &tokens, input, &rows, false).unwrap();
        let got = graphed.run(&specs, &tokens, input, &rows, false).unwrap();
        assert_eq!(got.greedy, want.greedy, "step {step}: drafts");
        assert_eq!(bits(&got.pre), bits(&want.pre), "step {step}: pre");
    }
    let (eager_blocks, graph_blocks) = (
        blocks(&eager_cache.lock().unwrap()),
        blocks(&graph_cache.lock().unwrap()),
    );
    for b in 0..SCRATCH as usize {
        assert!(eager_blocks[b] == graph_blocks[b], "block {b} differs");
    }
    assert!(
        graph_blocks[SCRATCH as usize] != scratch_before,
        "no padded row of a graph of step 0 wrote the scratch KV"
    );
}
