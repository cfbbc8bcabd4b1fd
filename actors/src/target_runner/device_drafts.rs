//! Drafts a proposal left on the device ([`crate::messages::Drafted::on_device`]): a
//! sequence's last `num_drafts` tokens are placeholders until the drafts themselves are
//! fed or read. A greedy verification of argmax-only sequences feeds them into its token
//! ids on the device and judges them there ([`crate::backend::ModelBackend::verify_fed`]),
//! so the host never waits for the head before the verification is queued and reads the
//! verdicts back once; any other step that carries
//! them (sampled or constrained sequences, logprobs, a prompt scored beside them) reads
//! them back first and runs as it would with drafts from the host.

use super::{prompt_scores, takes_argmax, RunSeq, TargetRunner};
use anyhow::anyhow;
use peregrine_models::draft_head::HandedDraft;
use std::ops::Range;

impl TargetRunner {
    /// Reads back the drafts on the device of `seqs` into their tokens, unless the step
    /// is a greedy verification of argmax-only sequences that feeds them on the device.
    pub(super) fn read_drafts_unless_fed(&mut self, seqs: &mut [RunSeq]) -> anyhow::Result<()> {
        if seqs.iter().all(|s| s.drafts_on_device.is_none()) || self.feeds_drafts(seqs)? {
            return Ok(());
        }
        let mut which = Vec::new();
        for s in seqs.iter() {
            which.extend_from_slice(placed(s)?);
        }
        let mut read = self.model.fetch_drafts(&which)?.into_iter();
        for s in seqs.iter_mut() {
            let Some(places) = s.drafts_on_device.take() else {
                continue;
            };
            let len = s.tokens.len();
            for (token, draft) in s.tokens[len - places.len()..].iter_mut().zip(read.by_ref()) {
                *token = draft;
            }
        }
        Ok(())
    }

    /// Whether the step of `seqs` verifies greedily from each row's argmax: no prompt is
    /// scored and every sampled sequence takes its argmax.
    fn feeds_drafts(&self, seqs: &[RunSeq]) -> anyhow::Result<bool> {
        let scoring = prompt_scores::scoring(seqs, &self.seqs)?;
        Ok(scoring.is_empty()
            && seqs
                .iter()
                .filter(|s| s.sample)
                .all(|s| self.seqs.get(&s.id).is_some_and(takes_argmax)))
    }
}

/// The places of `s`'s drafts on the device (none where they are on the host); an error
/// where they are not one a draft it verifies.
fn placed(s: &RunSeq) -> anyhow::Result<&[HandedDraft]> {
    let Some(places) = &s.drafts_on_device else {
        return Ok(&[]);
    };
    let n = s.num_drafts.min(s.tokens.len().saturating_sub(1));
    if places.len() != n || !s.sample {
        return Err(anyhow!(
            "{}: {} drafts on the device for {n} verified{}",
            s.id,
            places.len(),
            if s.sample {
                ""
            } else {
                " by a step that samples none"
            }
        ));
    }
    Ok(places)
}

/// The `(row, draft)` pairs that feed the drafts on the device of the sampled sequences
/// `seqs` (in step order, as the logit rows `rows` take them: each one's last `num_drafts
/// + 1`), into the rows of the step's tokens their placeholders hold.
pub(super) fn fed_rows<'a>(
    seqs: impl Iterator<Item = &'a RunSeq>,
    rows: &[usize],
) -> anyhow::Result<Vec<(usize, HandedDraft)>> {
    let mut fed = Vec::new();
    let mut at = 0;
    for s in seqs {
        let n = s.num_drafts.min(s.tokens.len() - 1);
        let own = rows
            .get(at..at + n + 1)
            .ok_or_else(|| anyhow!("{}: its rows lie past the step's {}", s.id, rows.len()))?;
        fed.extend(own[1..].iter().copied().zip(placed(s)?.iter().copied()));
        at += n + 1;
    }
    Ok(fed)
}

/// Each of the sampled sequences `seqs`' logit rows (in step order, as the step's logit
/// rows take them: each one's last `num_drafts + 1`), as indices into those rows.
pub(super) fn row_groups<'a>(seqs: impl Iterator<Item = &'a RunSeq>) -> Vec<Range<usize>> {
    let mut at = 0;
    seqs.map(|s| {
        let n = s.num_drafts.min(s.tokens.len() - 1);
        at += n + 1;
        at - n - 1..at
    })
    .collect()
}
