//! The disk tier's file: prefix-cache blocks written to one file per model under
//! `--kv-cache-dir`, found again after a restart, and read back only when they are proven
//! to be the blocks that were written, for this model.
//!
//! - [`chain`]: the content hash chain that names a block across processes (a chain id is
//!   one process's; the hash of every token from the start of the sequence is anyone's).
//! - [`format`]: the bytes of the file's header and of each slot's record header, each
//!   with a SHA-256 of its own fields.
//! - [`failed`]: reads that failed their checks while serving, reported back to the
//!   allocator.
//! - [`fingerprint`]: the model's and its block shape's fingerprint, which names its file.
//! - [`blocks`]: the file as a backend keeps it, its reads and writes as a block's bytes.
//! - [`queue`]: those reads and writes made in order on a thread of their own, the reads'
//!   bytes handed back for the backend to copy into its pool when it next looks.
//! - [`file`]: the file itself: locked against a second process, its header checked
//!   against the model's fingerprint, slots written data first and header last, read back
//!   with the data's checksum verified, found again by a scan at start-up.
//!
//! Every offset is a `u64` computed with checked arithmetic; files past 4 GiB are sparse
//! until written.

pub mod blocks;
pub mod chain;
pub mod failed;
pub mod file;
pub mod fingerprint;
pub mod format;
pub mod queue;

pub use blocks::DiskBlocks;
pub use chain::{chain_hash, ContentHash, ROOT_HASH};
pub use failed::{DiskTierStart, FailedRead, FailedReads};
pub use file::{DiskFile, DiskOpenError, FoundBlock, ReadError};
pub use fingerprint::{block_fingerprint, model_fingerprint, BlockShape};
pub use format::{FileHeader, FORMAT_VERSION};
pub use queue::{DiskQueue, FinishedRead};

#[cfg(test)]
mod tests;
