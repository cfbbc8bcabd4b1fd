//! The set of tokens a constrained row may sample (a grammar's mask): one bit per token id,
//! in 32-bit words, bit `id % 32` of word `id / 32` set when `id` is allowed, the layout
//! vLLM and llguidance use and the GPU's mask kernel reads. A row is masked before its
//! penalties and its distribution: a forbidden token's logit becomes −∞, so no filter,
//! draw or verification can choose it.

/// Allowed token ids of one row, as a bit set over a vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    vocab: usize,
}

impl TokenMask {
    /// The words needed for a vocabulary of `vocab` tokens.
    pub fn words_for(vocab: usize) -> usize {
        vocab.div_ceil(32)
    }

    /// A mask over `vocab` tokens from its words: bit `i % 32` of `words[i / 32]` allows
    /// token `i`. Bits at or past `vocab` are cleared; missing words allow nothing.
    pub fn from_words(mut words: Vec<u32>, vocab: usize) -> TokenMask {
        words.resize(Self::words_for(vocab), 0);
        if !vocab.is_multiple_of(32) {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (vocab % 32)) - 1;
            }
        }
        TokenMask { words, vocab }
    }

    /// A mask over `vocab` tokens allowing exactly `allowed` (ids past `vocab` ignored).
    pub fn allowing(allowed: impl IntoIterator<Item = u32>, vocab: usize) -> TokenMask {
        let mut words = vec![0u32; Self::words_for(vocab)];
        for id in allowed {
            if (id as usize) < vocab {
                words[id as usize / 32] |= 1 << (id % 32);
            }
        }
        TokenMask { words, vocab }
    }

    /// The vocabulary size the mask covers.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The bit words.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Whether token `id` is allowed (ids past the vocabulary never are).
    pub fn allows(&self, id: u32) -> bool {
        let id = id as usize;
        id < self.vocab && self.words[id / 32] & (1 << (id % 32)) != 0
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids, ascending.
    pub fn allowed(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(at, &word)| {
            (0..32)
                .filter(move |bit| word & (1 << bit) != 0)
                .map(move |bit| (at * 32 + bit) as u32)
        })
    }

    /// Sets the logit of every forbidden token to −∞. A row longer than the mask's
    /// vocabulary (a padded LM head) has its tail forbidden too.
    pub fn apply(&self, logits: &mut [f32]) {
        for (at, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(at).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// `logits` with [`TokenMask::apply`] done on a copy.
    pub fn applied(&self, logits: &[f32]) -> Vec<f32> {
        let mut masked = logits.to_vec();
        self.apply(&mut masked);
        masked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::testing::random_logits;

    #[test]
    fn bits_follow_the_shared_layout() {
        let mask = TokenMask::allowing([0, 31, 32, 69, 70], 70);
        assert_eq!(mask.words(), &[1 | (1 << 31), 1, 1 << 5]);
        assert_eq!(mask.count(), 4, "70 is past the vocabulary");
        assert!(mask.allows(69) && !mask.allows(70) && !mask.allows(33));
        assert_eq!(mask.allowed().collect::<Vec<_>>(), [0, 31, 32, 69]);
        let from = TokenMask::from_words(vec![u32::MAX; 3], 70);
        assert_eq!(from.count(), 70, "bits past the vocabulary are cleared");
    }

    #[test]
    fn forbidden_logits_become_negative_infinity() {
        let logits = random_logits(31, 100, 3.0);
        let allowed = [3u32, 40, 64, 99];
        let mask = TokenMask::allowing(allowed, 100);
        let masked = mask.applied(&logits);
        for (id, (&before, &after)) in logits.iter().zip(&masked).enumerate() {
            if allowed.contains(&(id as u32)) {
                assert_eq!(after, before, "token {id} is allowed");
            } else {
                assert_eq!(after, f32::NEG_INFINITY, "token {id} is forbidden");
            }
        }
        let mut padded = random_logits(32, 128, 1.0);
        TokenMask::allowing([5], 100).apply(&mut padded);
        assert!(padded[100..].iter().all(|&l| l == f32::NEG_INFINITY));
    }
}
