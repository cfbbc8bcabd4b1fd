//! A greedy proposal's steps queued back to back on the device (`HeadRunner::run_chain`):
//! the feed kernel against the host's gather, and a chained proposal against the same
//! proposal run one step at a time (each step's drafts and `pre` read back and fed to the
//! next): the same drafts, bit for bit, and the same head KV in every block but the
//! scratch block, whether step 0 runs through a graph of step 0 or on its own, and whether
//! the drafts are read back or left in a hand-off on the device; the hand-off's refusals.

use crate::eagle3::{blocks, first_step, gpu_head_spec, heads, ring_runner, table};
use crate::eagle3::{write_target_and_head, SCRATCH};
use crate::{random_f32, rng, setup};
use peregrine_actors::draft::{GpuHead, HeadCall, HeadRunner};
use peregrine_actors::graphs::CaptureSizes;
use peregrine_kernels::cuda::elementwise::{draft_feed, DraftFeedOut};
use peregrine_models::draft_head::cuda::hand_off::{DraftHandOff, HandOffError};
use peregrine_models::draft_head::HandedDraft;
use peregrine_models::eagle3::feature_ring::FeatureRing;
use peregrine_models::eagle3::HeadInput;
use peregrine_ops::SeqSpec;
use peregrine_runtime::cuda::Gpu;
use rand::Rng;
use std::sync::Arc;

#[test]
fn the_draft_feed_gathers_rows_and_maps_their_drafts_as_the_host_does() {
    let Some(s) = setup() else {
        return;
    };
    let mut rng = rng("the_draft_feed_gathers_rows_and_maps_their_drafts_as_the_host_does");
    let (src_rows, count, dim, vocab) = (13, 9, 37, 50);
    let pre = random_f32(&mut rng, src_rows * dim, 3.0);
    let ids: Vec<u32> = (0..src_rows).map(|_| rng.random_range(0..vocab)).collect();
    let rows: Vec<i32> = (0..count)
        .map(|_| rng.random_range(0..src_rows as i32))
        .collect();
    let to_target: Vec<i32> = (0..vocab).map(|_| rng.random_range(0..100_000)).collect();
    let g = &s.gpu;
    let (d_pre, d_ids) = (g.upload(&pre).unwrap(), g.upload(&ids).unwrap());
    let (d_rows, d_map) = (g.upload(&rows).unwrap(), g.upload(&to_target).unwrap());
    // Poisoned, one row past the count: what the kernel does not write stays so.
    let mut out_pre = g.upload(&vec![f32::NAN; (count + 1) * dim]).unwrap();
    let mut out_tokens = g.upload(&vec![-7i32; count + 1]).unwrap();
    let mut out_drafts = g.upload(&vec![-9i32; count + 1]).unwrap();
    draft_feed(
        &s.kernels,
        g.stream(),
        (&d_pre.as_view(), &d_ids.as_view()),
        &d_rows.as_view(),
        &d_map.as_view(),
        DraftFeedOut {
            pre: &mut out_pre.slice_mut(0..count * dim),
            tokens: &mut out_tokens.slice_mut(0..count),
            drafts: &mut out_drafts.slice_mut(0..count),
        },
        dim,
    )
    .unwrap();
    let (got_pre, got_tokens, got_drafts) = (
        g.download(&out_pre).unwrap(),
        g.download(&out_tokens).unwrap(),
        g.download(&out_drafts).unwrap(),
    );
    for (j, &r) in rows.iter().enumerate() {
        let r = r as usize;
        let want: Vec<u32> = pre[r * dim..(r + 1) * dim]
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let got: Vec<u32> = got_pre[j * dim..(j + 1) * dim]
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(got, want, "row {j} (from {r})");
        let token = to_target[ids[r] as usize];
        assert_eq!(
            (got_tokens[j], got_drafts[j]),
            (token, token),
            "row {j}'s draft"
        );
    }
    assert!(
        got_pre[count * dim..].iter().all(|x| x.is_nan()),
        "past the rows"
    );
    assert_eq!(
        (got_tokens[count], got_drafts[count]),
        (-7, -9),
        "past the rows"
    );
}

/// Stores `values` (`[rows, width]`) into `ring` on `target`'s stream; the rows' numbers.
fn store(ring: &FeatureRing, target: &Gpu, values: &[f32]) -> Vec<u64> {
    let s = setup().unwrap();
    let rows = values.len() / ring.width();
    let src = target.upload(values).unwrap();
    let first = ring
        .store(&s.kernels, target.stream(), &src.as_view(), rows)
        .unwrap();
    target.synchronize().unwrap();
    (first..first + rows as u64).collect()
}

/// The proposal one step at a time: step 0, then `later` draft steps each fed the drafts
/// and `pre` the step before read back. Each sequence's drafts.
fn stepped(head: &mut GpuHead, first: HeadCall<'_>, later: usize) -> Vec<Vec<u32>> {
    let h = head.hidden_size();
    let step0 = head
        .run(first.specs, first.tokens, first.input, first.rows, false)
        .unwrap();
    let mut drafts: Vec<Vec<u32>> = step0.greedy.iter().map(|&d| vec![d]).collect();
    let mut pre: Vec<f32> = first
        .rows
        .iter()
        .flat_map(|&r| step0.pre[r * h..(r + 1) * h].to_vec())
        .collect();
    let n = first.specs.len();
    for s in 1..=later {
        let specs: Vec<SeqSpec> = first
            .specs
            .iter()
            .map(|p| SeqSpec {
                num_cached: p.num_cached + p.num_new - 1 + s,
                num_new: 1,
                block_table: p.block_table,
            })
            .collect();
        let tokens: Vec<u32> = drafts.iter().map(|d| *d.last().unwrap()).collect();
        let rows: Vec<usize> = (0..n).collect();
        let step = head
            .run(&specs, &tokens, HeadInput::Pre(&pre), &rows, false)
            .unwrap();
        for (d, &t) in drafts.iter_mut().zip(&step.greedy) {
            d.push(t);
        }
        pre = step.pre;
    }
    drafts
}

/// Deterministic mode, two copies of one head, both with graphs: after the same prompts'
/// step 0, rounds of 5 sequences (graphs of 8, padded) and of 1, each step 0 of 1 to 4 rows
/// a sequence (through a graph of step 0) or of up to 6 (past those graphs: on its own),
/// then 3 draft steps: the chained copy drafts exactly what the stepped one does and
/// leaves every block of its cache as the stepped one does but the scratch block. A head
/// without graphs does not chain.
#[test]
fn a_chained_proposal_drafts_as_its_steps_run_one_by_one() {
    if setup().is_some() {
        chain_against_steps(false);
    }
}

/// The same with the chain's drafts left in a hand-off on the device, where step 0 runs
/// through a graph of step 0 (read back from there on the target's stream), and read back
/// by the head where it does not; a hand-off's drafts are stale once the next chain wrote.
#[test]
fn a_chained_proposal_handed_off_on_the_device_drafts_as_its_steps_run_one_by_one() {
    if setup().is_some() {
        chain_against_steps(true);
    }
}

fn chain_against_steps(handing_off: bool) {
    let dir = tempfile::tempdir().unwrap();
    write_target_and_head(dir.path(), &gpu_head_spec(false, true), 47);
    let target = Gpu::open(0).unwrap();
    let (host, _) = heads(dir.path(), true);
    let width = host.aux_layers().len() * host.config().target_hidden_size;
    let ring = Arc::new(FeatureRing::new(&target, 512, width).unwrap());
    let hand_off = Arc::new(DraftHandOff::new(&target, 64).unwrap());
    let ((mut one_by_one, stepped_cache), (mut chained, chained_cache)) = (
        ring_runner(dir.path(), &ring),
        ring_runner(dir.path(), &ring),
    );
    if handing_off {
        chained = chained.handing_drafts_to(hand_off.clone());
    }
    let (mut handed, mut last_places) = (0, None);
    let sizes = CaptureSizes::from_list(&[1, 2, 4, 8], 8).unwrap();
    for head in [&mut one_by_one, &mut chained] {
        head.capture_graphs(Some(&sizes)).unwrap();
    }
    let mut rng = rng("a_chained_proposal_drafts_as_its_steps_run_one_by_one");
    let lens = [7usize, 12, 5, 20, 9];
    let tables: Vec<Vec<u32>> = (0..lens.len()).map(table).collect();
    let mut cached = vec![0; lens.len()];
    // The prompts, then rounds of (sequences, step 0's rows a sequence): up to 4 rows run
    // through a graph of step 0, the 6 of the third round's second sequence on their own.
    let rounds: [(usize, Vec<usize>); 5] = [
        (5, lens.to_vec()),
        (5, vec![1, 4, 2, 3, 4]),
        (5, vec![2, 6, 1, 1, 3]),
        (1, vec![3]),
        (1, vec![1]),
    ];
    let mut compared = 0;
    for (round, (n, news)) in rounds.into_iter().enumerate() {
        let (_, rows) = first_step(&news, &tables[..n]);
        let specs: Vec<SeqSpec> = (0..n)
            .map(|i| SeqSpec {
                num_cached: cached[i],
                num_new: news[i],
                block_table: &tables[i],
            })
            .collect();
        let total: usize = news.iter().sum();
        let tokens: Vec<u32> = (0..total).map(|_| rng.random_range(0..1000)).collect();
        let ids = store(&ring, &target, &random_f32(&mut rng, total * width, 2.0));
        let call = HeadCall {
            specs: &specs,
            tokens: &tokens,
            input: HeadInput::Ring(&ids),
            rows: &rows,
        };
        let later = 3;
        if round == 0 {
            // The prompts: step 0 alone on both.
            for head in [&mut one_by_one, &mut chained] {
                head.run(&specs, &tokens, call.input, &rows, false).unwrap();
            }
        } else {
            let want = stepped(&mut one_by_one, call, later);
            let got = chained.run_chain(call, later).unwrap().expect("a chain");
            let places: Vec<HandedDraft> = got
                .iter()
                .flat_map(|d| d.on_device.iter().flatten().copied())
                .collect();
            let got: Vec<Vec<u32>> = match places.is_empty() {
                true => got.into_iter().map(|d| d.tokens).collect(),
                false => {
                    if let Some(stale) = last_places.replace(places[0]) {
                        let refused = hand_off.fetch(target.stream(), &[stale]);
                        assert!(matches!(refused, Err(HandOffError::Stale { .. })));
                    }
                    handed += 1;
                    let read = hand_off.fetch(target.stream(), &places).unwrap();
                    read.chunks(1 + later).map(<[u32]>::to_vec).collect()
                }
            };
            assert_eq!(got, want, "round {round}: drafts");
            assert!(got.iter().all(|d| d.len() == 1 + later));
            compared += 1;
        }
        // The next round's step 0 starts at this one's first draft position.
        for i in 0..n {
            cached[i] += news[i];
        }
    }
    assert_eq!(compared, 4);
    // Rounds 1, 3 and 4 run step 0 through its graphs; round 2 (6 rows) does not.
    assert_eq!(handed, if handing_off { 3 } else { 0 });
    let (stepped_blocks, chained_blocks) = (
        blocks(&stepped_cache.lock().unwrap()),
        blocks(&chained_cache.lock().unwrap()),
    );
    for b in 0..SCRATCH as usize {
        assert!(stepped_blocks[b] == chained_blocks[b], "block {b} differs");
    }
    // Without graphs, nothing chains.
    let (mut bare, _) = ring_runner(dir.path(), &ring);
    let specs = [SeqSpec {
        num_cached: 0,
        num_new: 1,
        block_table: &tables[0],
    }];
    let ids = store(&ring, &target, &random_f32(&mut rng, width, 2.0));
    let call = HeadCall {
        specs: &specs,
        tokens: &[5],
        input: HeadInput::Ring(&ids),
        rows: &[0],
    };
    assert!(bare.run_chain(call, 2).unwrap().is_none());
}

/// A hand-off refuses what it cannot serve, with nothing queued: a write past its room, a
/// draft past the last write or of an earlier one, a row past the step it feeds.
#[test]
fn a_draft_hand_off_refuses_stale_drafts_and_rows_past_the_step() {
    let Some(s) = setup() else {
        return;
    };
    let g = &s.gpu;
    let hand_off = DraftHandOff::new(g, 4).unwrap();
    let five = g.upload(&[1i32, 2, 3, 4, 5]).unwrap();
    let refused = hand_off.write(g.stream(), &five.as_view());
    assert!(matches!(
        refused,
        Err(HandOffError::Room {
            len: 5,
            capacity: 4
        })
    ));
    let three = g.upload(&[7i32, 8, 9]).unwrap();
    let first = hand_off.write(g.stream(), &three.as_view()).unwrap();
    let at = |generation, index| HandedDraft { generation, index };
    assert_eq!(
        hand_off
            .fetch(g.stream(), &[at(first, 2), at(first, 0)])
            .unwrap(),
        vec![9, 7]
    );
    let past = hand_off.fetch(g.stream(), &[at(first, 3)]);
    assert!(matches!(
        past,
        Err(HandOffError::Index { index: 3, len: 3 })
    ));
    // Fed into a step of 4 poisoned token ids: row 4 is past it.
    let mut ids = g.upload(&[-1i32; 4]).unwrap();
    let refused = hand_off.feed(
        &s.kernels,
        g.stream(),
        &[(4, at(first, 0))],
        &mut ids.as_view_mut(),
    );
    assert!(matches!(
        refused,
        Err(HandOffError::Row { row: 4, rows: 4 })
    ));
    hand_off
        .feed(
            &s.kernels,
            g.stream(),
            &[(3, at(first, 1)), (0, at(first, 2))],
            &mut ids.as_view_mut(),
        )
        .unwrap();
    assert_eq!(g.download(&ids).unwrap(), vec![9, -1, -1, 8]);
    let second = hand_off.write(g.stream(), &five.slice(0..2)).unwrap();
    let stale = hand_off.fetch(g.stream(), &[at(first, 0)]);
    assert!(matches!(stale, Err(HandOffError::Stale { .. })));
    assert_eq!(
        hand_off.fetch(g.stream(), &[at(second, 1)]).unwrap(),
        vec![2]
    );
}
