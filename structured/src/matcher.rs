//! One constrained request's grammar state: the masks of the rows it samples, the tokens
//! it consumes, the tokens the grammar forces, and the drafts it admits.

use llguidance::Matcher;
use peregrine_ops::sampling::TokenMask;

/// A request's position in its grammar. Errors are llguidance's messages: the grammar
/// reached a state it cannot continue from (its mask budget ran out, say), and the request
/// cannot go on constrained.
#[derive(Clone)]
pub struct GrammarMatcher {
    matcher: Matcher,
    vocab: usize,
    kind: &'static str,
    /// The first error, kept: a failed matcher stays failed.
    failed: Option<String>,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("kind", &self.kind)
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

/// The masks of a verification's rows, for drafts checked against the grammar.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftMasks {
    /// One mask per row that can be sampled: row `i` follows the first `i` drafts.
    pub masks: Vec<TokenMask>,
    /// How many leading drafts the grammar admits (`masks.len() - 1`); the matcher has
    /// consumed them, and [`GrammarMatcher::settle`] takes back those verification rejects.
    pub admitted: usize,
}

impl GrammarMatcher {
    pub(crate) fn new(matcher: Matcher, vocab: usize, kind: &'static str) -> GrammarMatcher {
        GrammarMatcher {
            matcher,
            vocab,
            kind,
            failed: None,
        }
    }

    /// Why the grammar cannot go on, once it cannot.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// `result`, its error kept as the matcher's failure.
    fn kept<T>(&mut self, result: Result<T, String>) -> Result<T, String> {
        if let Err(err) = &result {
            self.failed.get_or_insert_with(|| err.clone());
        }
        result
    }

    /// The constraint's kind.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The tokens the grammar allows next; only end-of-sequence once it is complete.
    pub fn mask(&mut self) -> Result<TokenMask, String> {
        if let Some(failure) = &self.failed {
            return Err(failure.clone());
        }
        let computed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|err| format!("{err:#}"))
            .map(|vob| TokenMask::from_words(vob.as_slice().to_vec(), self.vocab))
            .and_then(|mask| match mask.count() {
                0 => Err("the grammar allows no token here".to_owned()),
                _ => Ok(mask),
            });
        self.kept(computed)
    }

    /// Moves past `tokens`, which the grammar must allow.
    pub fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
        if let Some(failure) = &self.failed {
            return Err(failure.clone());
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        let consumed = self
            .matcher
            .consume_tokens(tokens)
            .map_err(|err| format!("{err:#}"));
        self.kept(consumed)
    }

    /// The tokens the grammar forces next (llguidance's fast-forward), consumed; empty
    /// where it leaves a choice or is complete.
    pub fn forced(&mut self) -> Vec<u32> {
        if self.failed.is_some() || self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.consume_ff_tokens()
    }

    /// Whether the grammar is complete and consumed its end (nothing may follow).
    pub fn is_stopped(&self) -> bool {
        self.failed.is_none() && self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// The masks of a verification over `drafts`: the mask before each draft the grammar
    /// admits and after the last of them. The admitted drafts are consumed; a draft the
    /// grammar forbids ends the list there (its row's mask forbids it, so verification
    /// rejects it), and the rows after it get no mask (they are never sampled).
    pub fn draft_masks(&mut self, drafts: &[u32]) -> Result<DraftMasks, String> {
        let mut masks = Vec::with_capacity(drafts.len() + 1);
        let mut admitted = 0;
        for &draft in drafts {
            let mask = self.mask()?;
            let allowed = mask.allows(draft) && !self.matcher.is_stopped();
            masks.push(mask);
            if !allowed {
                return Ok(DraftMasks { masks, admitted });
            }
            self.consume(&[draft])?;
            admitted += 1;
        }
        masks.push(self.mask()?);
        Ok(DraftMasks { masks, admitted })
    }

    /// After [`GrammarMatcher::draft_masks`] admitted `admitted` drafts and verification
    /// accepted `accepted` of them then chose `next`: takes back the rejected drafts and
    /// consumes `next`.
    pub fn settle(&mut self, admitted: usize, accepted: usize, next: u32) -> Result<(), String> {
        if accepted > admitted {
            let err = format!(
                "verification accepted {accepted} drafts but the grammar admitted {admitted}"
            );
            return self.kept(Err(err));
        }
        if admitted > accepted {
            let rolled = self
                .matcher
                .rollback(admitted - accepted)
                .map_err(|err| format!("{err:#}"));
            self.kept(rolled)?;
        }
        self.consume(&[next])
    }
}
