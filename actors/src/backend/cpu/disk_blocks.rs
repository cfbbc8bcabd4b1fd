//! The bytes of the disk tier below a CPU pool: the model's file under `--kv-cache-dir`
//! (`crate::kv_disk::DiskFile`), one slot a block, each holding the block's keys and values
//! of every layer as the pool's cache lays them out ([`KvCache::copy_block_out`]). The
//! index of what each slot holds is the KV allocator's (`kv_allocator/disk_tier.rs`); this
//! opens the file, checks what it holds at start-up, and makes the copies, in order.

use crate::kv_disk::{
    ContentHash, DiskFile, FailedRead, FailedReads, FileHeader, FoundBlock, FORMAT_VERSION,
};
use anyhow::Context;
use peregrine_ops::KvCache;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;

/// The disk tier's file, a block's worth of scratch, and where failed reads go.
pub struct DiskBlocks {
    file: DiskFile,
    scratch: Vec<u8>,
    failed: Arc<FailedReads>,
}

impl DiskBlocks {
    /// Opens the file of the model `model` (its fingerprint: see
    /// [`crate::kv_disk::model_fingerprint`]) and of `cache`'s block layout in `dir`, with
    /// as many slots as `bytes` holds, and returns it with the blocks it already holds
    /// whose data passes its checksum (a block that fails is erased, and counted in one
    /// log line).
    pub fn open(
        cache: &KvCache,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<(DiskBlocks, Vec<FoundBlock>)> {
        let layout = cache.layout();
        let block_bytes = cache.block_bytes();
        // The model, and how its cache lays a block out (not the pool's size).
        let mut fingerprint = Sha256::new();
        fingerprint.update(model);
        fingerprint.update(
            format!(
                "cpu {:?} {:?} block_size {} kv_heads {} head_dim {} block_bytes {block_bytes}",
                cache.dtype(),
                cache.rows(),
                layout.block_size,
                layout.num_kv_heads,
                layout.head_dim
            )
            .as_bytes(),
        );
        let mut header = FileHeader {
            version: FORMAT_VERSION,
            fingerprint: fingerprint.finalize().into(),
            block_bytes,
            block_tokens: u32::try_from(layout.block_size).context("block size past u32")?,
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
        let scratch = vec![0; usize::try_from(block_bytes)?];
        let failed = FailedReads::shared();
        Ok((
            DiskBlocks {
                file,
                scratch,
                failed,
            },
            valid,
        ))
    }

    /// Where the reads that fail their checks are reported, for the KV allocator.
    pub fn failed_reads(&self) -> Arc<FailedReads> {
        self.failed.clone()
    }

    /// Blocks the tier holds at most.
    pub fn slots(&self) -> u64 {
        self.file.header().slots
    }

    /// Writes pool block `block` of `cache` into `slot` as the block of `tokens` after the
    /// content chain `parent`.
    pub fn write_from_pool(
        &mut self,
        cache: &KvCache,
        block: u32,
        slot: u64,
        parent: &ContentHash,
        tokens: &[u32],
    ) -> anyhow::Result<()> {
        cache.copy_block_out(block, &mut self.scratch);
        self.write(slot, parent, tokens, &self.scratch)
    }

    /// Writes `data` (a block's bytes) into `slot` as the block of `tokens` after `parent`.
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

    /// Reads `slot`, checked to hold the block ending `chain`, into pool block `block` of
    /// `cache`. A block that fails its checks is not copied: its record is erased, the
    /// read is reported to the allocator (which forgets the slot and the pool block's
    /// entry), and the error returned.
    pub fn read_into(
        &mut self,
        cache: &mut KvCache,
        slot: u64,
        chain: &ContentHash,
        block: u32,
    ) -> anyhow::Result<()> {
        match self.file.read(slot, chain) {
            Ok(data) => {
                cache.copy_block_in(block, &data);
                Ok(())
            }
            Err(e) => {
                self.failed.report(FailedRead { slot, block });
                let erased = self.file.erase(slot);
                Err(anyhow::Error::new(e).context(format!(
                    "reading a KV block from {} (its record erased: {})",
                    self.file.path().display(),
                    erased.is_ok()
                )))
            }
        }
    }
}
