//! A step's plan as plain values: what the policy asks of the KV allocator ([`Schedule`])
//! and, once blocks are granted, what each sequence computes ([`StepPlan`]). The policy
//! (`super::policy`) makes them and the queues (`super::queues`) apply them; neither
//! imports the other for them.

use crate::messages::{Drafted, RequestId};
use peregrine_models::draft_head::HandedDraft;
use peregrine_ops::sampling::DraftDist;

/// One sequence's work in a step.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedSeq {
    pub id: RequestId,
    /// Tokens to compute: a prompt chunk, a recompute after preemption, or the last token
    /// (plus, before the proposal, room for up to `chunk - 1` drafts; after it, the drafts).
    pub chunk: usize,
    /// Draft tokens to verify after the fed tokens (`chunk - drafts.len()` are fed).
    pub drafts: Vec<u32>,
    /// The distribution each draft was sampled from; `None` for greedy drafts.
    pub draft_dists: Option<Vec<DraftDist>>,
    /// Where each draft lies on the device, where the proposal left them there (`drafts`
    /// then holds placeholders).
    pub drafts_on_device: Option<Vec<HandedDraft>>,
}

/// What the policy asks of the KV allocator for one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    /// Every running sequence, highest priority first, with its chunk (0 when the budget
    /// ran out before it).
    pub running: Vec<PlannedSeq>,
    /// Waiting sequences that may start, in order.
    pub admit: Vec<RequestId>,
    /// Tokens the step may still compute for them.
    pub token_budget: usize,
    /// Logit rows the step may still give the admitted sequences that score their prompt
    /// (`None`: unbounded).
    pub scoring_rows: Option<usize>,
}

/// The step's plan once blocks are granted: the sequences that compute something, in batch
/// order (priority, then arrival).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepPlan {
    pub seqs: Vec<PlannedSeq>,
}

impl StepPlan {
    /// Whether the step computes nothing.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Each sequence's chunk shrinks to its fed token plus the drafts it got (at most the
    /// room it was planned with); sequences missing from `drafts` verify none.
    pub fn with_drafts(mut self, drafts: Vec<(RequestId, Drafted)>) -> StepPlan {
        for (id, mut got) in drafts {
            if let Some(seq) = self.seqs.iter_mut().find(|s| s.id == id) {
                got.truncate(seq.chunk.saturating_sub(1));
                seq.chunk = 1 + got.tokens.len();
                seq.drafts = got.tokens;
                seq.draft_dists = got.dists;
                seq.drafts_on_device = got.on_device;
            }
        }
        self
    }
}
