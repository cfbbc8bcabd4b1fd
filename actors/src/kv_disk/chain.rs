//! The content hash chain: block `i` of a sequence is named by the SHA-256 of the name of
//! block `i - 1` and its own token ids, so a name stands for every token from the start of
//! the sequence to the end of the block, the same in every process.

use sha2::{Digest, Sha256};

/// The name of one content chain of whole blocks (32 bytes of SHA-256).
pub type ContentHash = [u8; 32];

/// The name of the empty chain, before a sequence's first block.
pub const ROOT_HASH: ContentHash = [0; 32];

/// The name of the chain `parent` continued by a block of `tokens`: SHA-256 over the
/// parent's name, the token count (u32, little-endian) and each token id (u32,
/// little-endian).
pub fn chain_hash(parent: &ContentHash, tokens: &[u32]) -> ContentHash {
    let mut hash = Sha256::new();
    hash.update(parent);
    hash.update((tokens.len() as u32).to_le_bytes());
    for token in tokens {
        hash.update(token.to_le_bytes());
    }
    hash.finalize().into()
}
