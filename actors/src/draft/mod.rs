//! The DraftProposer: owns the drafting method (an n-gram index over each request's own
//! tokens, or a draft model with its own KV cache) on a dedicated OS thread, because a
//! draft model's forwards block. Each step the scheduler sends one `Propose` for every
//! decoding sequence and gets their drafts back before it sends the target its batch; a
//! proposal that asks no drafts runs beside the target's step instead, and its reply is
//! waited for before the next proposal is sent.
//!
//! A method that needs the target's hidden states (an EAGLE-3 head, or a DeepSeek-V3 MTP
//! layer run as a head by the same method) names the target layers it reads; the engine
//! asks the target backend to record them, the runner returns them with each step, and
//! the scheduler passes them on with the next `Propose`.
//!
//! A draft model and an EAGLE-3 head (on either device) replay captured decode graphs for
//! their steps after the first; the engine captures them with the target's
//! (`CaptureGraphs`), between two proposals.

mod backend_draft;
mod build;
#[cfg(feature = "cuda")]
mod cuda_head;
mod draft_model;
mod eagle3;
mod head_blocks;
mod head_features;
mod head_runner;
mod ngram;
mod progress;

pub use backend_draft::BackendDraft;
#[cfg(feature = "cuda")]
pub(crate) use build::with_fault;
pub use build::{cpu_drafter, DraftSpec};
#[cfg(feature = "cuda")]
pub use cuda_head::{GpuHead, HeadCapacity};
pub use draft_model::DraftModel;
pub use eagle3::{Eagle3, LAZY_ROWS};
pub use head_runner::{CpuDraftHead, CpuHead, CpuMtpHead, HeadCall, HeadRunner, HeadStep};
pub use ngram::Ngram;

use crate::actor_thread::{reply_spinning, spawn_actor_thread, Spin, Stopped};
use crate::graphs::CaptureSizes;
use crate::messages::{Drafted, Drafts, HiddenRows, Propose, ProposeSeq, ProposerMsg, RequestId};
use anyhow::{anyhow, bail};
use peregrine_kernels::cpu::KvLayout;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::oneshot;

/// A way of proposing draft tokens.
pub trait DraftMethod: Send {
    /// Up to `max_drafts` drafts for each sequence, in the order of `seqs`: sampled, with
    /// the distributions they were drawn from, where the sequence asks it and the method
    /// has a distribution; greedy otherwise.
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>>;
    /// Forgets what the method holds for `id` (it ended or was preempted).
    fn release(&mut self, id: RequestId);
    /// The target layers whose inputs the method reads, if it reads any.
    fn hidden_layers(&self) -> Option<Vec<usize>> {
        None
    }
    /// Bytes one block takes in each K or V tensor of the method's draft layer (the step
    /// of a kernel's byte offset per block id), if it keeps KV and knows its layout.
    fn kv_bytes_per_block(&self) -> Option<u64> {
        None
    }
    /// The target hidden states of the steps since the last proposal, in step order.
    fn receive_hidden(&mut self, rows: Vec<HiddenRows>) {
        let _ = rows;
    }
    /// Whether the last [`DraftMethod::propose`] also ran rows beyond those the last
    /// verifications added: rows that waited while a sequence's drafts were paused
    /// (`ProposeSeq::drafts_paused`), or a prompt's.
    fn caught_up(&self) -> bool {
        false
    }
    /// Captures graphs of the method's decode steps for every size of `sizes`, replacing
    /// those held (on failure they stay); `None` drops them. A method that runs no graphs
    /// has nothing to capture.
    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        let _ = sizes;
        Ok(())
    }
}

/// Bytes one block of `layout` takes in one K or V tensor of `elem_bytes`-byte elements.
fn block_bytes(layout: &KvLayout, elem_bytes: u64) -> u64 {
    layout.block_size * layout.slot_elems() * elem_bytes
}

/// Sends messages to the proposer's thread: proposals, and graph captures.
#[derive(Clone)]
pub struct DraftProposerHandle {
    tx: crossbeam_channel::Sender<ProposerMsg>,
    /// How long [`ProposalReply::wait`] polls for the drafts before it sleeps.
    propose_spin: Duration,
}

/// Starts the proposer on its own thread, driving `method`; the thread stops (and drops the
/// method) once every handle is dropped. A handle polls for a proposal's drafts as `spin`
/// says; the proposer itself sleeps between proposals, which come a whole step apart.
pub fn spawn_proposer(
    mut method: Box<dyn DraftMethod>,
    spin: Spin,
) -> (DraftProposerHandle, Stopped) {
    let (tx, rx) = crossbeam_channel::unbounded::<ProposerMsg>();
    let stopped = spawn_actor_thread("draft-proposer", move || {
        let mut held = Held::new();
        for msg in rx {
            match msg {
                ProposerMsg::Propose(propose, reply) => {
                    let _ = reply.send(run(method.as_mut(), &mut held, propose));
                }
                ProposerMsg::CaptureGraphs(sizes, reply) => {
                    let _ = reply.send(method.capture_graphs(sizes.as_ref()));
                }
            }
        }
    });
    let handle = DraftProposerHandle {
        tx,
        propose_spin: spin.for_step,
    };
    (handle, stopped)
}

/// Each sequence's tokens and blocks as the proposer holds them between proposals.
type Held = HashMap<RequestId, (Vec<u32>, Vec<u32>)>;

fn run(method: &mut dyn DraftMethod, held: &mut Held, propose: Propose) -> anyhow::Result<Drafts> {
    method.receive_hidden(propose.hidden);
    for id in &propose.released {
        method.release(*id);
        held.remove(id);
    }
    for delta in &propose.seqs {
        let (tokens, blocks) = held
            .get(&delta.id)
            .map_or((0, 0), |(t, b)| (t.len(), b.len()));
        if delta.kept_tokens > tokens || delta.kept_blocks > blocks {
            bail!(
                "{} keeps {} tokens and {} blocks but the proposer holds {tokens} and {blocks}",
                delta.id,
                delta.kept_tokens,
                delta.kept_blocks
            );
        }
    }
    // Each sequence leaves `held` for the proposal and returns to it whatever the outcome.
    let seqs: Vec<ProposeSeq> = propose
        .seqs
        .into_iter()
        .map(|delta| {
            let (mut tokens, mut block_table) = held.remove(&delta.id).unwrap_or_default();
            tokens.truncate(delta.kept_tokens);
            tokens.extend(delta.new_tokens);
            block_table.truncate(delta.kept_blocks);
            block_table.extend(delta.new_blocks);
            ProposeSeq {
                id: delta.id,
                tokens,
                block_table,
                max_drafts: delta.max_drafts,
                sampling: delta.sampling,
                drafts_paused: delta.drafts_paused,
            }
        })
        .collect();
    let drafts = method.propose(&seqs);
    let ids: Vec<(RequestId, usize)> = seqs.iter().map(|s| (s.id, s.max_drafts)).collect();
    held.extend(seqs.into_iter().map(|s| (s.id, (s.tokens, s.block_table))));
    let drafts = drafts?;
    if drafts.len() != ids.len() {
        return Err(anyhow!(
            "{} drafts for {} sequences",
            drafts.len(),
            ids.len()
        ));
    }
    Ok(Drafts {
        step: propose.step,
        caught_up: method.caught_up(),
        drafts: ids
            .into_iter()
            .zip(drafts)
            .filter(|((_, max_drafts), _)| *max_drafts > 0)
            .map(|((id, max_drafts), mut d)| {
                d.truncate(max_drafts);
                (id, d)
            })
            .collect(),
    })
}

/// A proposal sent to the proposer, whose reply has not been waited for yet. The proposer
/// handles its messages in order, so a proposal sent later is answered after this one.
pub struct ProposalReply {
    rx: oneshot::Receiver<anyhow::Result<Drafts>>,
    spin: Duration,
}

impl ProposalReply {
    /// Waits for the drafts, polling first as the handle's spin says ([`reply_spinning`]).
    pub async fn wait(self) -> anyhow::Result<Drafts> {
        reply_spinning(self.rx, self.spin)
            .await
            .ok_or_else(|| anyhow!("the draft proposer dropped a step"))?
    }
}

impl DraftProposerHandle {
    /// Asks for the drafts of one step; [`ProposalReply::wait`] waits for them.
    pub fn send(&self, propose: Propose) -> anyhow::Result<ProposalReply> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ProposerMsg::Propose(propose, reply))
            .map_err(|_| anyhow!("the draft proposer has stopped"))?;
        Ok(ProposalReply {
            rx,
            spin: self.propose_spin,
        })
    }

    /// Captures the method's graphs for `sizes` on the proposer's thread, between two
    /// proposals (`None`: drops them); on failure the graphs held before stay.
    pub async fn capture_graphs(&self, sizes: Option<CaptureSizes>) -> anyhow::Result<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ProposerMsg::CaptureGraphs(sizes, reply))
            .map_err(|_| anyhow!("the draft proposer has stopped"))?;
        rx.await
            .map_err(|_| anyhow!("the draft proposer dropped a capture"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::ProposeDelta;

    /// A sequence of `tokens` proposed the first time, with room for `max_drafts`.
    fn delta(id: u64, tokens: &[u32], max_drafts: usize) -> ProposeDelta {
        ProposeDelta {
            id: RequestId(id),
            kept_tokens: 0,
            new_tokens: tokens.to_vec(),
            kept_blocks: 0,
            new_blocks: vec![0, 1],
            max_drafts,
            sampling: None,
            drafts_paused: false,
        }
    }

    #[test]
    fn the_reply_leaves_out_the_sequences_proposed_with_no_room() {
        let mut method = Ngram::new(1, 3).unwrap();
        let mut held = Held::new();
        // "5 6" recurs: n-gram lookup drafts "7 8" after the last 5 6.
        let tokens = [5, 6, 7, 8, 5, 6];
        let propose = Propose {
            step: 3,
            seqs: vec![delta(1, &tokens, 0), delta(2, &tokens, 2)],
            ..Propose::default()
        };
        let drafts = run(&mut method, &mut held, propose).unwrap();
        assert_eq!(
            drafts.drafts,
            vec![(RequestId(2), Drafted::greedy(vec![7, 8]))]
        );
        // Both are held for their next deltas.
        assert_eq!(held.len(), 2);
    }
}
