//! Admission: in order, until one does not fit or the token budget is spent; never
//! preempting. A sequence that scores its prompt reads nothing from the cache and shares
//! the scoring rows with the others that do.

use super::{admit, admit_all, computed, step, tokens, BlockManager};
use crate::messages::{AdmitSeq, AllocateStep, RequestId};

#[test]
fn admission_stops_at_the_first_that_does_not_fit() {
    let mut m = BlockManager::new(4, 4, true);
    let grant = admit_all(
        &mut m,
        &[
            (1, &tokens(0, 8)),
            (2, &tokens(100, 12)),
            (3, &tokens(200, 4)),
        ],
    );
    let ids: Vec<u64> = grant.admitted.iter().map(|a| a.id.0).collect();
    assert_eq!(ids, vec![1], "C would fit, but B comes first");
    assert_eq!(m.num_free_blocks(), 2);
    assert_eq!(m.block_table(RequestId(2)), None);
}

#[test]
fn admission_respects_the_token_budget() {
    let mut m = BlockManager::new(16, 4, true);
    let grant = step(
        &mut m,
        AllocateStep {
            admit: vec![
                admit(1, &tokens(0, 8)),
                admit(2, &tokens(100, 8)),
                admit(3, &tokens(200, 4)),
            ],
            token_budget: 10,
            ..AllocateStep::default()
        },
    );
    let got: Vec<(u64, usize, usize)> = grant
        .admitted
        .iter()
        .map(|a| (a.id.0, a.num_scheduled, a.block_table.len()))
        .collect();
    assert_eq!(got, vec![(1, 8, 2), (2, 2, 1)]);
    let none = step(
        &mut m,
        AllocateStep {
            admit: vec![admit(3, &tokens(200, 4))],
            token_budget: 0,
            ..AllocateStep::default()
        },
    );
    assert!(none.admitted.is_empty());
}

#[test]
fn cached_tokens_do_not_use_the_budget() {
    let mut m = BlockManager::new(16, 4, true);
    let prompt = tokens(0, 10);
    admit_all(&mut m, &[(1, &prompt)]);
    computed(&mut m, 1, &prompt);
    let grant = step(
        &mut m,
        AllocateStep {
            admit: vec![admit(2, &prompt)],
            token_budget: 3,
            ..AllocateStep::default()
        },
    );
    let b = &grant.admitted[0];
    assert_eq!(
        (b.num_cached, b.num_scheduled, b.block_table.len()),
        (8, 2, 3)
    );
}

#[test]
fn a_scoring_sequence_reads_no_cache_and_shares_the_scoring_rows() {
    let mut m = BlockManager::new(16, 4, true);
    let prompt = tokens(0, 10);
    admit_all(&mut m, &[(1, &prompt)]);
    computed(&mut m, 1, &prompt);
    let scoring = |id| AdmitSeq {
        scores_prompt: true,
        ..admit(id, &prompt)
    };
    let grant = step(
        &mut m,
        AllocateStep {
            admit: vec![scoring(2), admit(3, &prompt), scoring(4), admit(5, &prompt)],
            token_budget: 100,
            scoring_rows: Some(7),
            ..AllocateStep::default()
        },
    );
    let got: Vec<(u64, usize, usize)> = grant
        .admitted
        .iter()
        .map(|a| (a.id.0, a.num_cached, a.num_scheduled))
        .collect();
    // 2 takes 7 rows and no cached block; 3 is served from the cache as before; 4 finds
    // no row left, and admission stops there.
    assert_eq!(got, vec![(2, 0, 7), (3, 8, 2)]);
    assert_eq!(m.block_table(RequestId(4)), None);
}

#[test]
fn admission_never_preempts() {
    let mut m = BlockManager::new(4, 4, true);
    admit_all(&mut m, &[(1, &tokens(0, 16))]);
    let grant = admit_all(&mut m, &[(2, &tokens(100, 1))]);
    assert!(grant.admitted.is_empty());
    assert!(grant.preempted.is_empty());
    assert_eq!(m.block_table(RequestId(1)).map(<[u32]>::len), Some(4));
}

#[test]
fn an_empty_sequence_gets_no_blocks_and_an_admitted_id_restarts() {
    let mut m = BlockManager::new(4, 4, true);
    let grant = admit_all(&mut m, &[(1, &[])]);
    assert_eq!(grant.admitted[0].num_scheduled, 0);
    assert!(grant.admitted[0].block_table.is_empty());
    admit_all(&mut m, &[(2, &tokens(0, 16))]);
    let again = admit_all(&mut m, &[(2, &tokens(0, 12))]);
    assert_eq!(again.admitted[0].block_table.len(), 3);
    assert_eq!(m.num_free_blocks(), 1);
}
