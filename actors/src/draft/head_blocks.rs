//! Which blocks of the target's pool hold an EAGLE-3 head's KV for what they hold of the
//! target's, so that a sequence served from the prefix cache drafts from the head KV its
//! shared blocks already hold instead of getting no drafts.
//!
//! The head's KV at position p pairs the target's features at p (which depend on tokens
//! 0..=p) with token p + 1, so a whole block j holds valid head KV for one content: tokens
//! `0..(j+1)·B + 1`. Its key is a hash of that content, chained block by block. A block is
//! marked when a sequence's step 0 has covered all its positions; a block a sequence
//! newly owns is forgotten before the head writes into it (its drafts write KV there that
//! the next step 0 overwrites). A prefix hit is checked block by block against the keys of
//! the hitting sequence's own tokens: a block reused for other content, or whose last
//! position was paired with another next token, fails, and the sequence gets no drafts.
//! Drafts never change outputs (verification decides), so a hash collision could only
//! cost acceptance.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The head-valid blocks of one pool, by block id.
pub struct HeadBlocks {
    block_size: usize,
    keys: HashMap<u32, u64>,
}

/// What one sequence has marked or checked: the chain hash through each of its leading
/// blocks (`chains[j]` covers tokens `0..(j+1)·B`), and the table it saw.
#[derive(Default)]
pub struct SeqBlocks {
    chains: Vec<u64>,
    seen: Vec<u32>,
}

impl HeadBlocks {
    /// No block valid, for blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> HeadBlocks {
        HeadBlocks {
            block_size,
            keys: HashMap::new(),
        }
    }

    /// Checks that the first `num_cached` positions of `tokens` (a whole number of blocks
    /// of `table`) hold this content's head KV, and records them as the sequence's.
    pub fn check_prefix(
        &self,
        seq: &mut SeqBlocks,
        tokens: &[u32],
        table: &[u32],
        num_cached: usize,
    ) -> bool {
        let b = self.block_size;
        if !num_cached.is_multiple_of(b)
            || num_cached / b > table.len()
            || num_cached >= tokens.len()
        {
            return false;
        }
        let mut chains = Vec::with_capacity(num_cached / b);
        let mut chain = 0;
        for (j, &block) in table.iter().take(num_cached / b).enumerate() {
            chain = extend(chain, &tokens[j * b..(j + 1) * b]);
            if self.keys.get(&block) != Some(&key(chain, tokens[(j + 1) * b])) {
                return false;
            }
            chains.push(chain);
        }
        seq.chains = chains;
        seq.seen = table[..num_cached / b].to_vec();
        true
    }

    /// Forgets the blocks of `table` the sequence did not hold before (the head is about
    /// to write into them), and the marks past where its table changed.
    pub fn take_table(&mut self, seq: &mut SeqBlocks, table: &[u32]) {
        let same = seq
            .seen
            .iter()
            .zip(table)
            .take_while(|(a, b)| a == b)
            .count();
        seq.chains.truncate(same);
        for block in &table[same..] {
            self.keys.remove(block);
        }
        seq.seen = table.to_vec();
    }

    /// Marks the sequence's whole blocks that step 0 has covered: positions `0..computed`
    /// of `tokens` (`tokens[computed]` known).
    pub fn mark(&mut self, seq: &mut SeqBlocks, tokens: &[u32], table: &[u32], computed: usize) {
        let b = self.block_size;
        let upto = (computed / b).min(table.len());
        seq.chains.truncate(upto);
        while seq.chains.len() < upto {
            let j = seq.chains.len();
            let chain = extend(
                seq.chains.last().copied().unwrap_or(0),
                &tokens[j * b..(j + 1) * b],
            );
            self.keys.insert(table[j], key(chain, tokens[(j + 1) * b]));
            seq.chains.push(chain);
        }
    }

    /// Positions before `pos` stay marked; the sequence's later marks are dropped (the
    /// target ran them again).
    pub fn rewind(&self, seq: &mut SeqBlocks, pos: usize) {
        seq.chains.truncate(pos / self.block_size);
    }
}

/// The chain hash after `chain` and a block's tokens.
fn extend(chain: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    (chain, tokens).hash(&mut h);
    h.finish()
}

/// A block's key: its chain and the token after it.
fn key(chain: u64, next: u32) -> u64 {
    let mut h = DefaultHasher::new();
    (chain, next, 0x5eed_u32).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = 4;

    fn marked(tokens: &[u32], table: &[u32]) -> HeadBlocks {
        let mut blocks = HeadBlocks::new(B);
        let mut seq = SeqBlocks::default();
        blocks.take_table(&mut seq, table);
        blocks.mark(&mut seq, tokens, table, tokens.len() - 1);
        blocks
    }

    #[test]
    fn a_prefix_of_the_same_tokens_and_next_token_is_valid() {
        let tokens: Vec<u32> = (100..111).collect(); // 11 tokens: 2 whole blocks covered
        let table = [7, 3, 9];
        let blocks = marked(&tokens, &table);
        let mut other: Vec<u32> = tokens[..9].to_vec();
        other.extend([5, 5, 5]);
        let mut seq = SeqBlocks::default();
        assert!(blocks.check_prefix(&mut seq, &other, &[7, 3, 4], 8));
        assert!(blocks.check_prefix(&mut seq, &other, &[7, 1, 4], 4));
        // Not the same blocks, not whole blocks, or past what was covered.
        assert!(!blocks.check_prefix(&mut seq, &other, &[7, 1, 4], 8));
        assert!(!blocks.check_prefix(&mut seq, &other, &[7, 3, 4], 6));
        assert!(!blocks.check_prefix(&mut seq, &tokens, &table, 12));
    }

    #[test]
    fn another_next_token_or_other_content_is_not_valid() {
        let tokens: Vec<u32> = (100..111).collect();
        let blocks = marked(&tokens, &[7, 3, 9]);
        let mut seq = SeqBlocks::default();
        // Block 1's last position was paired with token 8 (108).
        let mut next = tokens.clone();
        next[8] = 1;
        assert!(!blocks.check_prefix(&mut seq, &next, &[7, 3, 4], 8));
        assert!(blocks.check_prefix(&mut seq, &next, &[7, 3, 4], 4));
        let mut early = tokens.clone();
        early[1] = 1;
        assert!(!blocks.check_prefix(&mut seq, &early, &[7, 3, 4], 4));
    }

    #[test]
    fn a_block_another_sequence_takes_is_forgotten() {
        let tokens: Vec<u32> = (100..111).collect();
        let mut blocks = marked(&tokens, &[7, 3, 9]);
        let mut seq = SeqBlocks::default();
        blocks.take_table(&mut seq, &[5, 3]);
        let mut check = SeqBlocks::default();
        assert!(!blocks.check_prefix(&mut check, &tokens, &[7, 3, 9], 8));
        assert!(blocks.check_prefix(&mut check, &tokens, &[7, 3, 9], 4));
        // A checked prefix is the sequence's own: taking its table keeps those blocks.
        blocks.take_table(&mut check, &[7, 8]);
        assert!(blocks.check_prefix(&mut SeqBlocks::default(), &tokens, &[7], 4));
    }

    #[test]
    fn marks_follow_a_rewind() {
        let tokens: Vec<u32> = (100..111).collect();
        let table = [7, 3, 9];
        let mut blocks = HeadBlocks::new(B);
        let mut seq = SeqBlocks::default();
        blocks.take_table(&mut seq, &table);
        blocks.mark(&mut seq, &tokens, &table, 10);
        blocks.rewind(&mut seq, 5);
        assert_eq!(seq.chains.len(), 1);
        blocks.mark(&mut seq, &tokens, &table, 10);
        assert_eq!(seq.chains.len(), 2);
        assert!(blocks.check_prefix(&mut SeqBlocks::default(), &tokens, &table, 8));
    }
}
