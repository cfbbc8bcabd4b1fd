//! Growing running sequences and preempting from the back of the list.

use super::{admit, admit_all, grow, preempted, step, tokens, BlockManager};
use crate::messages::{AllocateStep, RequestId};

fn full_pool_of_three() -> BlockManager {
    let mut m = BlockManager::new(6, 4, true);
    admit_all(
        &mut m,
        &[
            (1, &tokens(0, 8)),
            (2, &tokens(100, 8)),
            (3, &tokens(200, 8)),
        ],
    );
    assert_eq!(m.num_free_blocks(), 0);
    m
}

fn grow_step(m: &mut BlockManager, seqs: &[(u64, usize)]) -> crate::messages::StepGrant {
    step(
        m,
        AllocateStep {
            grow: seqs.iter().map(|&(id, n)| grow(id, n)).collect(),
            ..AllocateStep::default()
        },
    )
}

#[test]
fn growing_the_first_preempts_the_last() {
    let mut m = full_pool_of_three();
    let last = m.block_table(RequestId(3)).unwrap_or_default().to_vec();
    let grant = grow_step(&mut m, &[(1, 9), (2, 8), (3, 8)]);
    assert_eq!(preempted(&grant), vec![3]);
    let grown: Vec<(u64, usize)> = grant.grown.iter().map(|(id, t)| (id.0, t.len())).collect();
    assert_eq!(grown, vec![(1, 3), (2, 2)]);
    assert_eq!(m.block_table(RequestId(3)), None);
    let reused = grant.grown[0].1[2];
    assert!(last.contains(&reused));
    let still_free: Vec<u32> = last.into_iter().filter(|&b| b != reused).collect();
    assert_eq!(m.ref_count(still_free[0]), Some(0));
    assert_eq!(m.num_free_blocks(), 1);
}

#[test]
fn preemption_goes_on_until_the_first_fits() {
    let mut m = full_pool_of_three();
    let grant = grow_step(&mut m, &[(1, 20), (2, 8), (3, 8)]);
    assert_eq!(preempted(&grant), vec![3, 2]);
    assert_eq!(grant.grown.len(), 1);
    assert_eq!(grant.grown[0].1.len(), 5);
}

#[test]
fn the_last_sequence_may_preempt_itself() {
    let mut m = full_pool_of_three();
    let grant = grow_step(&mut m, &[(1, 8), (2, 8), (3, 9)]);
    assert_eq!(preempted(&grant), vec![3]);
    assert_eq!(grant.grown.len(), 2);
    assert_eq!(m.num_free_blocks(), 2);
}

#[test]
fn growth_within_the_last_block_takes_nothing() {
    let mut m = full_pool_of_three();
    let before = m.block_table(RequestId(2)).unwrap_or_default().to_vec();
    let grant = grow_step(&mut m, &[(2, 8), (2, 5), (1, 3)]);
    assert!(grant.preempted.is_empty());
    assert_eq!(grant.grown.len(), 2, "a repeated id counts once");
    assert_eq!(grant.grown[0].1, before);
    assert_eq!(grant.grown[1].1.len(), 2, "tables never shrink");
}

#[test]
fn an_unknown_id_is_reported_preempted() {
    let mut m = full_pool_of_three();
    let grant = grow_step(&mut m, &[(1, 8), (42, 30)]);
    assert_eq!(preempted(&grant), vec![42]);
    assert_eq!(m.num_free_blocks(), 0);
}

#[test]
fn a_step_that_preempts_admits_nothing() {
    let mut m = full_pool_of_three();
    // Growing 1 preempts 3, which frees a block; the waiting request would fit in it but
    // must wait for a step without preemption.
    let grant = step(
        &mut m,
        AllocateStep {
            grow: vec![grow(1, 9), grow(2, 8), grow(3, 8)],
            admit: vec![admit(4, &tokens(300, 2))],
            token_budget: 100,
            ..AllocateStep::default()
        },
    );
    assert_eq!(preempted(&grant), vec![3]);
    assert!(grant.admitted.is_empty());
    assert_eq!(m.num_free_blocks(), 1);
}
