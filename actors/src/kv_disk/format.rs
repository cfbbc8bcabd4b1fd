//! The bytes of the disk tier's file: a header page that says what the file is for, then
//! slots of one record-header page and the block's data (padded to whole pages). Every
//! header ends with the SHA-256 of its own fields, so a torn or damaged header is never
//! taken for a valid one; a record also carries the SHA-256 of its data, which a read
//! checks before the data is used. Integers are little-endian.

use super::chain::{chain_hash, ContentHash};
use sha2::{Digest, Sha256};

/// The file format's version, part of every file header: a file of another version is
/// not read.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes of the file header and of each record header: one page each, so that every
/// block's data starts on a page.
pub const PAGE: u64 = 4096;

const FILE_MAGIC: [u8; 8] = *b"PGKVDISK";
const RECORD_MAGIC: [u8; 4] = *b"PGKB";
const SUM: usize = 32;
/// A record header's fixed fields: magic, token count, slot, chain, parent, data sum.
const RECORD_FIXED: usize = 4 + 4 + 8 + 32 + 32 + 32;

/// The most tokens a block may hold: what fits a record header's page.
pub const MAX_BLOCK_TOKENS: usize = (PAGE as usize - RECORD_FIXED - SUM) / 4;

/// What a file is for, written at its start and compared when it is opened again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// [`FORMAT_VERSION`] when written by this build.
    pub version: u32,
    /// The model's fingerprint (its weights, the KV cache's dtype and layout).
    pub fingerprint: ContentHash,
    /// Bytes of one block's data.
    pub block_bytes: u64,
    /// Tokens of one block.
    pub block_tokens: u32,
    /// Slots the file holds.
    pub slots: u64,
}

impl FileHeader {
    /// The header's page.
    pub fn encode(&self) -> Vec<u8> {
        let mut page = Vec::with_capacity(PAGE as usize);
        page.extend_from_slice(&FILE_MAGIC);
        page.extend_from_slice(&self.version.to_le_bytes());
        page.extend_from_slice(&self.fingerprint);
        page.extend_from_slice(&self.block_bytes.to_le_bytes());
        page.extend_from_slice(&self.block_tokens.to_le_bytes());
        page.extend_from_slice(&self.slots.to_le_bytes());
        let sum: [u8; SUM] = Sha256::digest(&page).into();
        page.extend_from_slice(&sum);
        page.resize(PAGE as usize, 0);
        page
    }

    /// The header in `page`, or why it is not one (another kind of file, a damaged
    /// header). The version is returned as written: the caller compares it.
    pub fn decode(page: &[u8]) -> Result<FileHeader, String> {
        let fields = 8 + 4 + 32 + 8 + 4 + 8;
        if page.len() < fields + SUM || page[..8] != FILE_MAGIC {
            return Err("not a Peregrine KV file (no header)".into());
        }
        let sum: [u8; SUM] = Sha256::digest(&page[..fields]).into();
        if page[fields..fields + SUM] != sum {
            return Err("its header is damaged (checksum)".into());
        }
        let mut at = 8;
        let mut take = |n: usize| {
            let bytes = &page[at..at + n];
            at += n;
            bytes
        };
        Ok(FileHeader {
            version: u32::from_le_bytes(take(4).try_into().expect("4 bytes")),
            fingerprint: take(32).try_into().expect("32 bytes"),
            block_bytes: u64::from_le_bytes(take(8).try_into().expect("8 bytes")),
            block_tokens: u32::from_le_bytes(take(4).try_into().expect("4 bytes")),
            slots: u64::from_le_bytes(take(8).try_into().expect("8 bytes")),
        })
    }

    /// Bytes from one slot's start to the next's: a record page and the data in whole
    /// pages; `None` where that overflows.
    pub fn slot_stride(&self) -> Option<u64> {
        self.block_bytes
            .checked_next_multiple_of(PAGE)?
            .checked_add(PAGE)
    }

    /// Where slot `slot`'s record header starts; `None` past the file's slots or where
    /// the offset overflows.
    pub fn slot_offset(&self, slot: u64) -> Option<u64> {
        if slot >= self.slots {
            return None;
        }
        self.slot_stride()?.checked_mul(slot)?.checked_add(PAGE)
    }

    /// The file's full length; `None` where it overflows.
    pub fn file_len(&self) -> Option<u64> {
        self.slot_stride()?
            .checked_mul(self.slots)?
            .checked_add(PAGE)
    }
}

/// One slot's record header: which block its data is, and the data's checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// The slot it was written for (a record found in another slot is not valid).
    pub slot: u64,
    /// The chain the block ends: `chain_hash(parent, tokens)`.
    pub chain: ContentHash,
    /// The chain the block continues.
    pub parent: ContentHash,
    /// The block's token ids.
    pub tokens: Vec<u32>,
    /// SHA-256 of the block's data.
    pub data_sum: ContentHash,
}

impl RecordHeader {
    /// The record's page; an error for more tokens than [`MAX_BLOCK_TOKENS`].
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        if self.tokens.len() > MAX_BLOCK_TOKENS {
            return Err(format!(
                "a block of {} tokens does not fit a record (at most {MAX_BLOCK_TOKENS})",
                self.tokens.len()
            ));
        }
        let mut page = Vec::with_capacity(PAGE as usize);
        page.extend_from_slice(&RECORD_MAGIC);
        page.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        page.extend_from_slice(&self.slot.to_le_bytes());
        page.extend_from_slice(&self.chain);
        page.extend_from_slice(&self.parent);
        page.extend_from_slice(&self.data_sum);
        for token in &self.tokens {
            page.extend_from_slice(&token.to_le_bytes());
        }
        let sum: [u8; SUM] = Sha256::digest(&page).into();
        page.extend_from_slice(&sum);
        page.resize(PAGE as usize, 0);
        Ok(page)
    }

    /// The record in `page` if it is a valid one written for `slot`: its magic, its own
    /// checksum, its slot, and a chain that is the hash of its parent and tokens; `None`
    /// for an empty, torn, damaged or misplaced record.
    pub fn decode(page: &[u8], slot: u64) -> Option<RecordHeader> {
        if page.len() < RECORD_FIXED + SUM || page[..4] != RECORD_MAGIC {
            return None;
        }
        let count = u32::from_le_bytes(page[4..8].try_into().ok()?) as usize;
        if count > MAX_BLOCK_TOKENS {
            return None;
        }
        let end = RECORD_FIXED + 4 * count;
        let sum: [u8; SUM] = Sha256::digest(&page[..end]).into();
        if page[end..end + SUM] != sum {
            return None;
        }
        let record = RecordHeader {
            slot: u64::from_le_bytes(page[8..16].try_into().ok()?),
            chain: page[16..48].try_into().ok()?,
            parent: page[48..80].try_into().ok()?,
            data_sum: page[80..112].try_into().ok()?,
            tokens: page[RECORD_FIXED..end]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect(),
        };
        (record.slot == slot && record.chain == chain_hash(&record.parent, &record.tokens))
            .then_some(record)
    }
}
