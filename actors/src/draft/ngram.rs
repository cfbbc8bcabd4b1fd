//! Prompt lookup (n-gram) drafting: find the longest suffix of the request's own tokens,
//! between `min` and `max` tokens long, that occurred earlier in them, and propose the
//! tokens that followed its most recent earlier occurrence. No model, no state.

use super::DraftMethod;
use crate::messages::{Drafted, ProposeSeq, RequestId};

/// The n-gram method with its match lengths.
#[derive(Debug)]
pub struct Ngram {
    min: usize,
    max: usize,
}

impl Ngram {
    /// Matches suffixes of `min..=max` tokens; refused unless `1 <= min <= max`.
    pub fn new(min: usize, max: usize) -> anyhow::Result<Ngram> {
        if min == 0 || min > max {
            anyhow::bail!("ngram_min ({min}) must be at least 1 and at most ngram_max ({max})");
        }
        Ok(Ngram { min, max })
    }
}

impl DraftMethod for Ngram {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        Ok(seqs
            .iter()
            .map(|s| Drafted::greedy(lookup(&s.tokens, self.min, self.max, s.max_drafts)))
            .collect())
    }

    fn release(&mut self, _id: RequestId) {}
}

/// Up to `k` tokens following the most recent earlier occurrence of the longest suffix of
/// `tokens` of `min..=max` tokens; empty when no suffix recurs.
pub fn lookup(tokens: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (min..=max.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // Occurrences that end before the suffix itself starts to overlap its own end.
        let found = (0..len - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == suffix);
        if let Some(start) = found {
            let from = start + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_longest_most_recent_match() {
        //            0  1  2  3  4  5  6  7  8  9
        let tokens = [1, 2, 3, 9, 1, 2, 3, 4, 1, 2, 3];
        // Suffix [1,2,3] occurred at 4 (most recent) and 0: what followed 4 is 4, 1, 2.
        assert_eq!(lookup(&tokens, 1, 3, 3), vec![4, 1, 2]);
        assert_eq!(lookup(&tokens, 1, 3, 1), vec![4]);
        // Only 2-grams: [2,3] last occurred at 5, followed by 4.
        assert_eq!(lookup(&tokens, 2, 2, 2), vec![4, 1]);
    }

    #[test]
    fn falls_back_to_shorter_matches_and_stops_at_the_end() {
        let tokens = [5, 6, 7, 8, 6];
        // No 2-gram ends the sequence twice; the 1-gram [6] occurred at 1.
        assert_eq!(lookup(&tokens, 1, 3, 5), vec![7, 8, 6]);
        assert_eq!(lookup(&tokens, 2, 3, 5), Vec::<u32>::new());
    }

    #[test]
    fn nothing_without_a_match_or_room() {
        assert!(lookup(&[1, 2, 3, 4], 1, 3, 3).is_empty());
        assert!(lookup(&[1], 1, 3, 3).is_empty());
        assert!(lookup(&[1, 1, 1], 1, 3, 0).is_empty());
    }

    #[test]
    fn bad_lengths_are_refused() {
        assert!(Ngram::new(0, 3)
            .unwrap_err()
            .to_string()
            .contains("ngram_min"));
        assert!(Ngram::new(4, 3).is_err());
    }
}
