//! The disk tier as a backend keeps it: the model's file (`DiskFile`) named by its block
//! shape, checked at start-up, and its slots written and read as a block's bytes, however
//! the backend's pool gets them in and out. A read that fails its checks hands out
//! nothing: its record is erased and the read reported to the KV allocator.

use super::chain::ContentHash;
use super::failed::{DiskTierStart, FailedRead, FailedReads};
use super::file::DiskFile;
use super::fingerprint::{block_fingerprint, BlockShape};
use super::format::{FileHeader, FORMAT_VERSION};
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;

/// An open disk tier and where its failed reads go.
pub struct DiskBlocks {
    file: DiskFile,
    failed: Arc<FailedReads>,
}

impl DiskBlocks {
    /// Opens the file of the model `model` (its fingerprint: see
    /// [`super::model_fingerprint`]) and of the block shape `shape` in `dir`, with as many
    /// slots as `bytes` holds, and returns it with what the allocator starts from: the
    /// blocks it already holds whose data passes its checksum (a block that fails is
    /// erased, and counted in one log line).
    pub fn open(
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
        shape: &BlockShape,
    ) -> anyhow::Result<(DiskBlocks, DiskTierStart)> {
        let mut header = FileHeader {
            version: FORMAT_VERSION,
            fingerprint: block_fingerprint(model, shape),
            block_bytes: shape.block_bytes,
            block_tokens: u32::try_from(shape.layout.block_size).context("block size past u32")?,
            slots: 0,
        };
        let stride = header
            .slot_stride()
            .context("a block past a 64-bit file offset")?;
        header.slots = bytes / stride;
        if header.slots == 0 {
            anyhow::bail!(
                "kv_disk_space ({bytes} bytes) holds no block of this pool ({stride} bytes a \
                 block on disk)"
            );
        }
        let (file, found) = DiskFile::open(dir, header)?;
        let mut valid = Vec::with_capacity(found.len());
        let mut damaged = 0usize;
        for block in found {
            match file.read(block.slot, &block.chain) {
                Ok(_) => valid.push(block),
                Err(_) => {
                    damaged += 1;
                    file.erase(block.slot).with_context(|| {
                        format!("erasing slot {} of {}", block.slot, file.path().display())
                    })?;
                }
            }
        }
        if damaged > 0 {
            tracing::warn!(
                "{}: {damaged} blocks failed their checks and were dropped",
                file.path().display()
            );
        }
        tracing::info!(
            "KV disk tier {}: {} slots, {} blocks found",
            file.path().display(),
            file.header().slots,
            valid.len()
        );
        let disk = DiskBlocks {
            file,
            failed: FailedReads::shared(),
        };
        let start = DiskTierStart {
            slots: disk.file.header().slots,
            found: valid,
            failed: disk.failed.clone(),
        };
        Ok((disk, start))
    }

    /// Bytes of one block's data.
    pub fn block_bytes(&self) -> u64 {
        self.file.header().block_bytes
    }

    /// Writes `data` (a block's bytes) into `slot` as the block of `tokens` after the
    /// content chain `parent`.
    pub fn write(
        &self,
        slot: u64,
        parent: &ContentHash,
        tokens: &[u32],
        data: &[u8],
    ) -> anyhow::Result<()> {
        self.file
            .write(slot, parent, tokens, data)
            .with_context(|| format!("writing slot {slot} of {}", self.file.path().display()))?;
        Ok(())
    }

    /// The bytes of `slot`, checked to hold the block ending `chain`, which are to fill
    /// pool block `block`. A block that fails its checks is not handed out: its record is
    /// erased, the read is reported to the allocator (which forgets the slot and the pool
    /// block's entry), and the error returned.
    pub fn read(&self, slot: u64, chain: &ContentHash, block: u32) -> anyhow::Result<Vec<u8>> {
        self.file.read(slot, chain).map_err(|e| {
            self.failed.report(FailedRead { slot, block });
            let erased = self.file.erase(slot);
            anyhow::Error::new(e).context(format!(
                "reading a KV block from {} (its record erased: {})",
                self.file.path().display(),
                erased.is_ok()
            ))
        })
    }
}
