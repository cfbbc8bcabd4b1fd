//! Drafting with a smaller model run by a backend of its own (the CUDA backend's draft,
//! `ModelBackend::take_draft`): its pool holds the same blocks as the target's, so each
//! sequence's draft KV lives in the blocks of its target KV, and the backend replays its
//! decode graphs for the pure decode steps. The drafting loop is `DraftProgress`'s; a
//! catch-up larger than the backend's step runs in pieces.

use super::progress::DraftProgress;
use super::DraftMethod;
use crate::backend::{ModelBackend, PoolInfo};
use crate::graphs::CaptureSizes;
use crate::messages::{ProposeSeq, RequestId};
use anyhow::{bail, Context};
use peregrine_ops::{AttentionPlan, SeqSpec};

/// The draft-model method on a backend.
pub struct BackendDraft {
    backend: Box<dyn ModelBackend>,
    progress: DraftProgress,
}

impl BackendDraft {
    /// The draft `backend` for a target whose pool is `target`: refused unless the two
    /// pools have the same blocks.
    pub fn new(backend: Box<dyn ModelBackend>, target: &PoolInfo) -> anyhow::Result<BackendDraft> {
        let (d, t) = (&backend.pool().layout, &target.layout);
        if (d.num_blocks, d.block_size) != (t.num_blocks, t.block_size) {
            bail!(
                "the draft's pool has {} blocks of {} tokens, the target's {} of {}",
                d.num_blocks,
                d.block_size,
                t.num_blocks,
                t.block_size
            );
        }
        let block_size = t.block_size as usize;
        Ok(BackendDraft {
            backend,
            progress: DraftProgress::new(block_size),
        })
    }
}

/// The greedy token after the last token of each of `specs` (whose `tokens` follow one
/// another), through `backend` in as few forwards as its step capacity allows: a spec
/// longer than a step runs in pieces, each piece in its own forward.
fn greedy(
    backend: &mut dyn ModelBackend,
    specs: &[SeqSpec],
    tokens: &[u32],
) -> anyhow::Result<Vec<u32>> {
    let layout = backend.pool().layout;
    let (block_size, num_blocks) = (layout.block_size as usize, layout.num_blocks);
    let (max_tokens, max_seqs) = backend.capacity().map_or((usize::MAX, usize::MAX), |c| {
        (c.max_tokens, c.max_seqs.min(c.max_logit_rows))
    });
    let mut out = vec![0; specs.len()];
    // The pieces of the forward being gathered: (spec, piece, its tokens' start).
    let mut pieces: Vec<(usize, SeqSpec, usize)> = Vec::new();
    let mut gathered = 0;
    let mut flush = |pieces: &mut Vec<(usize, SeqSpec, usize)>| -> anyhow::Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        let plan_specs: Vec<SeqSpec> = pieces.iter().map(|(_, p, _)| *p).collect();
        let plan = AttentionPlan::new(&plan_specs, block_size, num_blocks)?;
        let mut ids = Vec::new();
        let mut rows = Vec::new();
        for (_, piece, start) in pieces.iter() {
            ids.extend_from_slice(&tokens[*start..*start + piece.num_new]);
            rows.push(ids.len() - 1);
        }
        let chosen = backend
            .forward_argmax(&ids, &plan, &rows)
            .context("draft model forward")?;
        for ((spec, piece, _), id) in pieces.iter().zip(chosen) {
            // A spec's last piece gives its draft.
            if piece.num_cached + piece.num_new == specs[*spec].num_cached + specs[*spec].num_new {
                out[*spec] = id;
            }
        }
        pieces.clear();
        Ok(())
    };
    let mut start = 0;
    for (i, spec) in specs.iter().enumerate() {
        let mut done = 0;
        while done < spec.num_new {
            let len = (spec.num_new - done).min(max_tokens);
            if gathered + len > max_tokens || pieces.len() == max_seqs {
                flush(&mut pieces)?;
                gathered = 0;
            }
            let piece = SeqSpec {
                num_cached: spec.num_cached + done,
                num_new: len,
                block_table: spec.block_table,
            };
            pieces.push((i, piece, start + done));
            gathered += len;
            done += len;
        }
        start += spec.num_new;
    }
    flush(&mut pieces)?;
    Ok(out)
}

impl DraftMethod for BackendDraft {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Vec<u32>>> {
        let backend = self.backend.as_mut();
        self.progress
            .propose(seqs, &mut |specs, tokens, _rows, _decode| {
                greedy(backend, specs, tokens)
            })
    }

    fn release(&mut self, id: RequestId) {
        self.progress.release(id);
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.backend
            .capture_graphs(sizes)
            .context("capturing the draft model's graphs")
    }
}
