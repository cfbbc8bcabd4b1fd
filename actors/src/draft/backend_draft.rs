//! Drafting with a smaller model run by a backend of its own (a draft model the CUDA
//! backend loads beside the target): its pool holds the same blocks as the target's, so each
//! sequence's draft KV lives in the blocks of its target KV, and the backend replays its
//! decode graphs for the pure decode steps. The drafting loop is `DraftProgress`'s; a
//! catch-up larger than the backend's step runs in pieces.

use super::progress::DraftProgress;
use super::DraftMethod;
use crate::backend::{ModelBackend, PoolInfo, RowMasks, StepInput, StepOutput, StepSource, Wanted};
use crate::graphs::CaptureSizes;
use crate::messages::{Drafted, ProposeSeq, RequestId};
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

/// One forward's pieces: (the spec it belongs to, the piece, where its tokens start).
pub(super) type Forward<'a> = Vec<(usize, SeqSpec<'a>, usize)>;

/// `specs` (whose tokens follow one another) cut into forwards of at most `max_tokens`
/// tokens and `max_seqs` pieces, in order: a spec longer than `max_tokens` is cut into
/// pieces, each ending a forward, so no forward holds two pieces of one sequence.
pub(super) fn forwards<'a>(
    specs: &[SeqSpec<'a>],
    max_tokens: usize,
    max_seqs: usize,
) -> Vec<Forward<'a>> {
    let mut all = Vec::new();
    let mut current: Forward = Vec::new();
    let mut gathered = 0;
    let mut start = 0;
    for (i, spec) in specs.iter().enumerate() {
        let mut done = 0;
        while done < spec.num_new {
            let len = (spec.num_new - done).min(max_tokens);
            if gathered + len > max_tokens || current.len() == max_seqs {
                all.push(std::mem::take(&mut current));
                gathered = 0;
            }
            let piece = SeqSpec {
                num_cached: spec.num_cached + done,
                num_new: len,
                block_table: spec.block_table,
            };
            current.push((i, piece, start + done));
            gathered += len;
            done += len;
        }
        start += spec.num_new;
    }
    if !current.is_empty() {
        all.push(current);
    }
    all
}

/// The greedy token after the last token of each of `specs` (whose `tokens` follow one
/// another), through `backend` in as few forwards as its step capacity allows.
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
    for pieces in forwards(specs, max_tokens, max_seqs) {
        let plan_specs: Vec<SeqSpec> = pieces.iter().map(|(_, p, _)| *p).collect();
        let plan = AttentionPlan::new(&plan_specs, block_size, num_blocks)?;
        let mut ids = Vec::new();
        let mut rows = Vec::new();
        for (_, piece, start) in &pieces {
            ids.extend_from_slice(&tokens[*start..*start + piece.num_new]);
            rows.push(ids.len() - 1);
        }
        let input = StepInput {
            source: StepSource::Fresh {
                tokens: &ids,
                plan: &plan,
                logit_rows: &rows,
            },
            wanted: Wanted::Argmax {
                next: None,
                masks: RowMasks::None,
            },
        };
        let chosen = backend
            .run(input)
            .and_then(StepOutput::argmax)
            .context("draft model forward")?;
        for ((spec, piece, _), id) in pieces.iter().zip(chosen) {
            // A spec's last piece gives its draft.
            let spec_end = specs[*spec].num_cached + specs[*spec].num_new;
            if piece.num_cached + piece.num_new == spec_end {
                out[*spec] = id;
            }
        }
    }
    Ok(out)
}

impl DraftMethod for BackendDraft {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        let backend = self.backend.as_mut();
        let drafts = self
            .progress
            .propose(seqs, &mut |specs, tokens, _rows, _decode| {
                greedy(backend, specs, tokens)
            })?;
        Ok(drafts.into_iter().map(Drafted::greedy).collect())
    }

    fn release(&mut self, id: RequestId) {
        self.progress.release(id);
    }

    fn kv_bytes_per_block(&self) -> Option<u64> {
        // One layer's K plus V bytes, halved, over its blocks.
        let pool = self.backend.pool();
        pool.bytes_per_layer.checked_div(2 * pool.layout.num_blocks)
    }

    fn capture_graphs(&mut self, sizes: Option<&CaptureSizes>) -> anyhow::Result<()> {
        self.backend
            .capture_graphs(sizes)
            .context("capturing the draft model's graphs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forwards stay within the step, cover every spec's tokens once and in order, and
    /// never hold two pieces of one sequence.
    #[test]
    fn a_catch_up_is_cut_into_forwards_within_the_step() {
        let table = [0u32; 8];
        let lens = [3, 70, 5, 1, 1, 64, 130];
        let specs: Vec<SeqSpec> = lens
            .iter()
            .map(|&n| SeqSpec {
                num_cached: 2,
                num_new: n,
                block_table: &table,
            })
            .collect();
        let all = forwards(&specs, 64, 2);
        let mut next = vec![(2usize, 0usize); specs.len()];
        let mut start = 0;
        let starts: Vec<usize> = lens
            .iter()
            .map(|&n| {
                start += n;
                start - n
            })
            .collect();
        for f in &all {
            assert!(!f.is_empty() && f.len() <= 2, "{f:?}");
            assert!(f.iter().map(|(_, p, _)| p.num_new).sum::<usize>() <= 64);
            for (k, (i, _, _)) in f.iter().enumerate() {
                assert!(
                    f[..k].iter().all(|(j, _, _)| j != i),
                    "two pieces of spec {i}"
                );
            }
            for (i, p, at) in f {
                let (cached, done) = next[*i];
                assert_eq!((p.num_cached, *at), (cached, starts[*i] + done), "spec {i}");
                next[*i] = (cached + p.num_new, done + p.num_new);
            }
        }
        let covered: Vec<usize> = next.iter().map(|&(_, done)| done).collect();
        assert_eq!(covered, lens);
        // Packed in order: 70 = 64 + 6 and 130 = 64 + 64 + 2.
        let shape: Vec<Vec<usize>> = all
            .iter()
            .map(|f| f.iter().map(|(_, p, _)| p.num_new).collect())
            .collect();
        let want = [
            vec![3],
            vec![64],
            vec![6, 5],
            vec![1, 1],
            vec![64],
            vec![64],
            vec![64],
            vec![2],
        ];
        assert_eq!(shape, want);
    }
}
