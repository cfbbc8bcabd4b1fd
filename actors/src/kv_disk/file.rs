//! The disk tier's file: `kv-<fingerprint>.blocks` under the cache directory, beside the
//! lock file `kv-<fingerprint>.lock` that one process holds while the file is open.
//!
//! A slot is written in three steps (its record header erased, its data, its record header
//! with the data's checksum), so a write cut short leaves no record that passes its
//! checks. A read checks the record (its own checksum, its slot, the chain asked for) and
//! then the data's checksum, and hands out nothing that fails. No write is synced: this is
//! a cache, and the checksums stand in for durability.

use super::chain::{chain_hash, ContentHash};
use super::format::{FileHeader, RecordHeader, PAGE};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Why the disk tier's file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DiskOpenError {
    /// Another process holds the file's lock.
    #[error(
        "{path} is locked by another Peregrine process serving this model from the same \
         --kv-cache-dir; give each process a directory of its own"
    )]
    Locked { path: PathBuf },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The file's length does not fit a 64-bit offset.
    #[error("a disk tier of {slots} slots of {block_bytes} bytes is past a 64-bit file offset")]
    TooLarge { slots: u64, block_bytes: u64 },
}

/// Why a slot's block was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The slot holds no valid record (never written, torn, damaged or misplaced).
    #[error("slot {slot} holds no valid record")]
    NoRecord { slot: u64 },
    /// The slot's record names another chain.
    #[error("slot {slot} holds another block")]
    OtherBlock { slot: u64 },
    /// The data does not match the record's checksum.
    #[error("slot {slot}'s data fails its checksum")]
    Damaged { slot: u64 },
    /// A file operation failed (a truncated file among them).
    #[error("slot {slot}: {source}")]
    Io { slot: u64, source: io::Error },
}

/// A valid record the start-up scan found: which block a slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundBlock {
    /// The slot.
    pub slot: u64,
    /// The chain the block ends.
    pub chain: ContentHash,
    /// The chain it continues.
    pub parent: ContentHash,
    /// Its token ids.
    pub tokens: Vec<u32>,
}

/// The open file of one model's disk tier.
pub struct DiskFile {
    file: File,
    header: FileHeader,
    path: PathBuf,
    /// Locked while this is open (the lock goes with the handle).
    _lock: File,
}

impl DiskFile {
    /// Opens the file for `header` (its fingerprint names it) in `dir`, creating both,
    /// and returns it with the valid records it already holds. A file whose header differs
    /// from `header` (another format version, block shape or a damaged header) starts
    /// afresh, said in one log line; a file of the same blocks in more or fewer slots
    /// keeps the records of the slots both have. Other models' files in `dir` are left
    /// alone, one log line each.
    pub fn open(
        dir: &Path,
        header: FileHeader,
    ) -> Result<(DiskFile, Vec<FoundBlock>), DiskOpenError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DiskOpenError::Io { path, source }
        };
        let len = header.file_len().ok_or(DiskOpenError::TooLarge {
            slots: header.slots,
            block_bytes: header.block_bytes,
        })?;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let stem = format!("kv-{}", hex(&header.fingerprint[..8]));
        let lock_path = dir.join(format!("{stem}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(DiskOpenError::Locked { path: lock_path }),
            Err(TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
        }
        let path = dir.join(format!("{stem}.blocks"));
        note_other_files(dir, &path, &header);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let on_disk = file.metadata().map_err(io_err(&path))?.len();
        let mut page = vec![0; PAGE as usize];
        let old = if on_disk >= PAGE {
            file.read_exact_at(&mut page, 0).map_err(io_err(&path))?;
            Some(FileHeader::decode(&page))
        } else {
            None
        };
        // Slots whose records may still be valid: those of the same blocks.
        let keep = match old {
            Some(Ok(old)) if old.version == header.version && same_blocks(&old, &header) => {
                old.slots.min(header.slots)
            }
            Some(Ok(old)) => {
                tracing::info!(
                    "{}: written for another format version or block shape (version {}, \
                     {} tokens, {} bytes a block); starting it afresh",
                    path.display(),
                    old.version,
                    old.block_tokens,
                    old.block_bytes
                );
                0
            }
            Some(Err(why)) => {
                tracing::info!("{}: {why}; starting it afresh", path.display());
                0
            }
            None => 0,
        };
        if keep == 0 {
            file.set_len(0).map_err(io_err(&path))?;
        }
        // Sparse up to its length: slots never written read as zeros (no record).
        file.set_len(len).map_err(io_err(&path))?;
        file.write_all_at(&header.encode(), 0)
            .map_err(io_err(&path))?;
        let disk = DiskFile {
            file,
            header,
            path,
            _lock: lock,
        };
        let found = disk.scan(keep, on_disk);
        Ok((disk, found))
    }

    /// The file's header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the block of `tokens` after the chain `parent`, whose data is `data`
    /// (exactly a block's bytes), into `slot`, and returns the chain it ends.
    pub fn write(
        &self,
        slot: u64,
        parent: &ContentHash,
        tokens: &[u32],
        data: &[u8],
    ) -> io::Result<ContentHash> {
        let at = self.offset(slot)?;
        if data.len() as u64 != self.header.block_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a block of {} bytes for slots of {}",
                    data.len(),
                    self.header.block_bytes
                ),
            ));
        }
        let chain = chain_hash(parent, tokens);
        let record = RecordHeader {
            slot,
            chain,
            parent: *parent,
            tokens: tokens.to_vec(),
            data_sum: Sha256::digest(data).into(),
        }
        .encode()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.erase(slot)?;
        self.file.write_all_at(data, at + PAGE)?;
        self.file.write_all_at(&record, at)?;
        Ok(chain)
    }

    /// Reads the block ending `chain` from `slot`, checked: its record and its data's
    /// checksum.
    pub fn read(&self, slot: u64, chain: &ContentHash) -> Result<Vec<u8>, ReadError> {
        let io = |source| ReadError::Io { slot, source };
        let at = self.offset(slot).map_err(io)?;
        let mut page = vec![0; PAGE as usize];
        self.file.read_exact_at(&mut page, at).map_err(io)?;
        let record = RecordHeader::decode(&page, slot).ok_or(ReadError::NoRecord { slot })?;
        if &record.chain != chain {
            return Err(ReadError::OtherBlock { slot });
        }
        let mut data = vec![0; self.header.block_bytes as usize];
        self.file.read_exact_at(&mut data, at + PAGE).map_err(io)?;
        let sum: ContentHash = Sha256::digest(&data).into();
        if sum != record.data_sum {
            return Err(ReadError::Damaged { slot });
        }
        Ok(data)
    }

    /// Erases `slot`'s record: a restart finds nothing there.
    pub fn erase(&self, slot: u64) -> io::Result<()> {
        let at = self.offset(slot)?;
        self.file.write_all_at(&[0; 4], at)
    }

    /// The byte offset of `slot`'s record; an error past the file's slots.
    fn offset(&self, slot: u64) -> io::Result<u64> {
        self.header.slot_offset(slot).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} of a file of {} slots", self.header.slots),
            )
        })
    }

    /// The valid records of the first `slots` slots; a slot past the `on_disk` bytes the
    /// file had (cut short) or whose record fails its checks holds nothing.
    fn scan(&self, slots: u64, on_disk: u64) -> Vec<FoundBlock> {
        let mut found = Vec::new();
        let mut page = vec![0; PAGE as usize];
        for slot in 0..slots {
            let Ok(at) = self.offset(slot) else { break };
            let end = at.checked_add(PAGE + self.header.block_bytes);
            if end.is_none_or(|end| end > on_disk) {
                break;
            }
            if self.file.read_exact_at(&mut page, at).is_err() {
                continue;
            }
            if let Some(r) = RecordHeader::decode(&page, slot) {
                found.push(FoundBlock {
                    slot,
                    chain: r.chain,
                    parent: r.parent,
                    tokens: r.tokens,
                });
            }
        }
        found
    }
}

/// Whether two headers are for the same blocks (all but the slot count).
fn same_blocks(a: &FileHeader, b: &FileHeader) -> bool {
    a.fingerprint == b.fingerprint
        && a.block_bytes == b.block_bytes
        && a.block_tokens == b.block_tokens
}

/// Says, one log line each, which other block files in `dir` are left alone.
fn note_other_files(dir: &Path, ours: &Path, header: &FileHeader) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path == ours || !(name.starts_with("kv-") && name.ends_with(".blocks")) {
            continue;
        }
        let mut page = vec![0; PAGE as usize];
        let why = match File::open(&path).and_then(|f| f.read_exact_at(&mut page, 0)) {
            Err(e) => format!("unreadable ({e})"),
            Ok(()) => match FileHeader::decode(&page) {
                Err(why) => why,
                Ok(h) if h.fingerprint != header.fingerprint => "another model or KV layout".into(),
                Ok(_) => "this model's, under another name".into(),
            },
        };
        tracing::info!(
            "{}: not this model's KV blocks ({why}); left alone",
            path.display()
        );
    }
}

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
