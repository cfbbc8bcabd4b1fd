//! Tests of the KV allocator. Every helper here checks the invariants after each step.

mod actor;
mod admission;
mod caching_off;
mod collision;
mod disk_tier;
mod events;
mod eviction;
mod host_tier;
mod large_pool;
mod preemption;
mod random;
mod sharing;

use super::BlockManager;
use crate::messages::{AdmitSeq, AllocateStep, ComputedSeq, GrowSeq, RequestId, StepGrant};
use std::sync::Arc;

/// Applies `step` and checks the invariants.
fn step(m: &mut BlockManager, step: AllocateStep) -> StepGrant {
    let grant = m.allocate_step(step);
    if let Err(broken) = m.check_invariants() {
        panic!("invariant broken: {broken}");
    }
    grant
}

/// Admits `seqs` with a budget large enough for all of them.
fn admit_all(m: &mut BlockManager, seqs: &[(u64, &[u32])]) -> StepGrant {
    step(
        m,
        AllocateStep {
            admit: seqs.iter().map(|&(id, t)| admit(id, t)).collect(),
            token_budget: usize::MAX,
            ..AllocateStep::default()
        },
    )
}

/// Reports that all of `tokens` are computed for `id`.
fn computed(m: &mut BlockManager, id: u64, tokens: &[u32]) -> StepGrant {
    step(
        m,
        AllocateStep {
            computed: vec![ComputedSeq {
                id: RequestId(id),
                first_block: 0,
                tokens: tokens.to_vec(),
            }],
            ..AllocateStep::default()
        },
    )
}

/// Frees `ids`.
fn free(m: &mut BlockManager, ids: &[u64]) -> StepGrant {
    step(
        m,
        AllocateStep {
            free: ids.iter().map(|&id| RequestId(id)).collect(),
            ..AllocateStep::default()
        },
    )
}

fn admit(id: u64, tokens: &[u32]) -> AdmitSeq {
    AdmitSeq {
        id: RequestId(id),
        tokens: Arc::from(tokens),
        scores_prompt: false,
    }
}

fn grow(id: u64, tokens_after_step: usize) -> GrowSeq {
    GrowSeq {
        id: RequestId(id),
        tokens_after_step,
    }
}

/// `n` tokens counting up from `start`: distinct from any other range.
fn tokens(start: u32, n: u32) -> Vec<u32> {
    (start..start + n).collect()
}

/// The ids of `grant`'s preempted sequences.
fn preempted(grant: &StepGrant) -> Vec<u64> {
    grant.preempted.iter().map(|id| id.0).collect()
}
