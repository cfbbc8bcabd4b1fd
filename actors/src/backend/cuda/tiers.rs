//! The tiers below a GPU pool, host memory (`host_blocks.rs`) and disk
//! (`disk_blocks.rs`), and the runs their moves are made in: consecutive moves of one
//! kind, as many as the shared staging buffer holds, in the order the KV allocator gave
//! them, every copy on the target's stream ahead of the next forward, except the loads
//! into the pool, which run on a stream of their own (`load_lane.rs`): the host tier's at
//! once, the disk reads once the disk tier's thread has made and checked them;
//! [`GpuTiers::finish_loads`] reports both.

use super::disk_blocks::{GpuDiskBlocks, PoolWrite};
use super::host_blocks::GpuHostBlocks;
use super::load_lane::LoadLane;
use super::staging::BlockStaging;
use crate::kv_disk::{ContentHash, DiskTierStart};
use crate::messages::{KvMove, KvSource, LoadDone};
use anyhow::anyhow;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_ops::cuda::GpuKvCache;
use peregrine_runtime::cuda::Gpu;
use std::path::Path;

/// The tiers kept below a GPU pool, the staging buffer their copies on the target's
/// stream share, and the lane their loads run on (before the host tier, so that it is
/// dropped, waiting for its copies, before the slots they read).
pub struct GpuTiers {
    staging: BlockStaging,
    lane: LoadLane,
    host: Option<GpuHostBlocks>,
    disk: Option<GpuDiskBlocks>,
}

impl GpuTiers {
    /// No tier yet, with the staging buffer for blocks of `cache` and the load lane.
    pub fn new(gpu: &Gpu, cache: &GpuKvCache) -> anyhow::Result<GpuTiers> {
        Ok(GpuTiers {
            staging: BlockStaging::for_cache(gpu, cache)?,
            lane: LoadLane::new(gpu, cache)?,
            host: None,
            disk: None,
        })
    }

    /// Keeps a host tier of up to `bytes` ([`GpuHostBlocks::for_cache`]) and returns its
    /// slots.
    pub fn keep_host(&mut self, cache: &GpuKvCache, bytes: u64) -> anyhow::Result<u32> {
        let host = GpuHostBlocks::for_cache(cache, bytes)?;
        let slots = host.slots();
        self.host = Some(host);
        Ok(slots)
    }

    /// Blocks the host tier holds (0: none).
    pub fn host_slots(&self) -> u32 {
        self.host.as_ref().map_or(0, GpuHostBlocks::slots)
    }

    /// Keeps a disk tier of up to `bytes` in `dir` for the model `model`
    /// ([`GpuDiskBlocks::open`]) and returns what the allocator starts from.
    pub fn keep_disk(
        &mut self,
        gpu: &Gpu,
        cache: &GpuKvCache,
        dir: &Path,
        bytes: u64,
        model: &ContentHash,
    ) -> anyhow::Result<DiskTierStart> {
        let (disk, start) = GpuDiskBlocks::open(gpu, cache, &self.staging, dir, bytes, model)?;
        self.lane.keep_room(gpu, cache)?;
        self.disk = Some(disk);
        Ok(start)
    }

    /// Makes `moves` in order, queued on `gpu`'s stream (a disk write's block is on the
    /// host, queued to the disk tier's thread, before this returns; a disk read is queued
    /// to the thread). Every pool block is checked against `cache` before anything is
    /// copied.
    pub fn apply(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        moves: &[KvMove],
    ) -> anyhow::Result<()> {
        let pool = cache.layout().num_blocks;
        let host_slots = self.host_slots();
        for m in moves {
            let (block, slot) = match *m {
                KvMove::Spill { block, slot } | KvMove::Load { slot, block } => {
                    (Some(block), Some(slot))
                }
                KvMove::DiskWrite { from, .. } => match from {
                    KvSource::Pool(block) => (Some(block), None),
                    KvSource::Host(slot) => (None, Some(slot)),
                },
                KvMove::DiskRead { block, .. } => (Some(block), None),
            };
            if block.is_some_and(|b| u64::from(b) >= pool) || slot.is_some_and(|s| s >= host_slots)
            {
                anyhow::bail!(
                    "{m:?} outside a pool of {pool} blocks and a host tier of {host_slots} slots"
                );
            }
        }
        let GpuTiers {
            staging,
            lane,
            host,
            disk,
        } = self;
        let no_host = || anyhow!("host-tier moves for a GPU backend that keeps no host tier");
        let no_disk = || anyhow!("disk-tier moves for a GPU backend that keeps no disk tier");
        let mut rest = moves;
        while !rest.is_empty() {
            let (run, after) = rest.split_at(run_length(rest, staging.entries()));
            rest = after;
            match run_kind(&run[0]) {
                RunKind::Spill => {
                    let pairs = pick(run, |m| match *m {
                        KvMove::Spill { block, slot } => Some((block, slot)),
                        _ => None,
                    });
                    let host = host.as_mut().ok_or_else(no_host)?;
                    lane.fence(gpu)?;
                    host.spill(gpu, kernels, cache, staging, &pairs)?;
                }
                RunKind::Load => {
                    let pairs = pick(run, |m| match *m {
                        KvMove::Load { slot, block } => Some((slot, block)),
                        _ => None,
                    });
                    let host = host.as_mut().ok_or_else(no_host)?;
                    lane.load(gpu, kernels, cache, host, &pairs)?;
                }
                RunKind::WritePool => {
                    let writes = pick(run, |m| match m {
                        KvMove::DiskWrite {
                            from: KvSource::Pool(block),
                            slot,
                            parent,
                            tokens,
                        } => Some(PoolWrite {
                            block: *block,
                            slot: *slot,
                            parent,
                            tokens,
                        }),
                        _ => None,
                    });
                    let disk = disk.as_mut().ok_or_else(no_disk)?;
                    disk.write_from_pool(gpu, kernels, cache, staging, &writes)?;
                }
                RunKind::WriteHost => {
                    let disk = disk.as_ref().ok_or_else(no_disk)?;
                    let host = host.as_ref().ok_or_else(no_host)?;
                    for m in run {
                        if let KvMove::DiskWrite {
                            from: KvSource::Host(h),
                            slot,
                            parent,
                            tokens,
                        } = m
                        {
                            disk.write(*slot, parent, tokens, host.read_slot(gpu, *h)?);
                        }
                    }
                }
                RunKind::Read => {
                    let disk = disk.as_mut().ok_or_else(no_disk)?;
                    for m in run {
                        if let KvMove::DiskRead { slot, chain, block } = m {
                            disk.read(*slot, chain, *block);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The loads finished since the last call: the runs on the lane whose event has passed
    /// and the disk reads that failed their checks; the checked disk reads the tier's
    /// thread has made are queued on the lane first ([`LoadLane::upload`]). With `wait`, at
    /// least one while any is pending.
    pub fn finish_loads(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        wait: bool,
    ) -> anyhow::Result<Vec<LoadDone>> {
        let loaded =
            |blocks: Vec<u32>| blocks.into_iter().map(|block| LoadDone { block, ok: true });
        let mut done = self.take_disk_reads(gpu, kernels, cache, false)?;
        done.extend(loaded(self.lane.finished(false)?));
        if wait && done.is_empty() {
            if !self.lane.is_pending() {
                done.extend(self.take_disk_reads(gpu, kernels, cache, true)?);
            }
            if done.is_empty() {
                done.extend(loaded(self.lane.finished(true)?));
            }
        }
        Ok(done)
    }

    /// The disk reads the tier's thread has finished: the failed ones returned, the checked
    /// ones queued on the lane in runs of what a staging buffer holds, no pool block twice
    /// in a run. With `wait`, at least one read while any is pending.
    fn take_disk_reads(
        &mut self,
        gpu: &Gpu,
        kernels: &CudaKernels,
        cache: &mut GpuKvCache,
        wait: bool,
    ) -> anyhow::Result<Vec<LoadDone>> {
        let Some(disk) = self.disk.as_mut() else {
            return Ok(Vec::new());
        };
        if disk.pending() == 0 {
            return Ok(Vec::new());
        }
        let (failed, checked) = disk.take_finished(wait);
        let entries = self.staging.entries().max(1);
        let mut run: Vec<(u32, Vec<u8>)> = Vec::new();
        for (block, data) in checked {
            if run.len() == entries || run.iter().any(|(b, _)| *b == block) {
                self.lane.upload(gpu, kernels, cache, &run)?;
                run.clear();
            }
            run.push((block, data));
        }
        if !run.is_empty() {
            self.lane.upload(gpu, kernels, cache, &run)?;
        }
        Ok(failed)
    }
}

/// What a run does: moves of one kind go together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunKind {
    /// Pool blocks into host slots.
    Spill,
    /// Host slots into pool blocks.
    Load,
    /// Pool blocks into disk slots.
    WritePool,
    /// Host slots into disk slots.
    WriteHost,
    /// Disk slots into pool blocks.
    Read,
}

/// The kind of run `m` belongs to.
fn run_kind(m: &KvMove) -> RunKind {
    match m {
        KvMove::Spill { .. } => RunKind::Spill,
        KvMove::Load { .. } => RunKind::Load,
        KvMove::DiskWrite {
            from: KvSource::Pool(_),
            ..
        } => RunKind::WritePool,
        KvMove::DiskWrite {
            from: KvSource::Host(_),
            ..
        } => RunKind::WriteHost,
        KvMove::DiskRead { .. } => RunKind::Read,
    }
}

/// How many of `moves` from the first go together: of one kind, at most `staged` (what the
/// staging buffer holds), and no two writing one pool block (a scatter's blocks are
/// written side by side).
fn run_length(moves: &[KvMove], staged: usize) -> usize {
    let kind = run_kind(&moves[0]);
    let mut written = Vec::new();
    moves
        .iter()
        .take(staged.max(1))
        .take_while(|m| {
            let block = match **m {
                KvMove::Load { block, .. } | KvMove::DiskRead { block, .. } => Some(block),
                _ => None,
            };
            let fresh = block.is_none_or(|b| !written.contains(&b));
            written.extend(block);
            run_kind(m) == kind && fresh
        })
        .count()
}

/// What `each` picks of a run's moves.
fn pick<'a, T>(run: &'a [KvMove], each: impl Fn(&'a KvMove) -> Option<T>) -> Vec<T> {
    run.iter().filter_map(each).collect()
}

#[cfg(test)]
mod tests {
    use super::{run_length, KvMove, KvSource};
    use std::sync::Arc;

    #[test]
    fn runs_keep_one_kind_fit_the_staging_buffer_and_never_write_a_block_twice() {
        let spill = |block, slot| KvMove::Spill { block, slot };
        let load = |slot, block| KvMove::Load { slot, block };
        let read = |slot, block| KvMove::DiskRead {
            slot,
            chain: [slot as u8; 32],
            block,
        };
        let write = |from, slot| KvMove::DiskWrite {
            from,
            slot,
            parent: [0; 32],
            tokens: Arc::from(vec![1u32, 2]),
        };
        let moves = [spill(1, 0), spill(2, 1), load(0, 7), spill(3, 0)];
        assert_eq!(run_length(&moves, 8), 2);
        assert_eq!(run_length(&moves[2..], 8), 1);
        assert_eq!(run_length(&moves, 1), 1);
        assert_eq!(run_length(&moves, 0), 1);
        let loads = [load(0, 7), load(1, 8), load(2, 7), load(3, 9)];
        assert_eq!(run_length(&loads, 8), 2);
        assert_eq!(run_length(&loads[2..], 8), 2);
        // Disk reads: one kind with themselves, never one pool block twice, and a load
        // into a block a read writes is another run.
        let reads = [read(4, 7), read(5, 8), read(6, 8), load(0, 9)];
        assert_eq!(run_length(&reads, 8), 2);
        assert_eq!(run_length(&reads[2..], 8), 1);
        let mixed = [read(4, 7), load(0, 8)];
        assert_eq!(run_length(&mixed, 8), 1);
        // Writes from the pool and from host slots are runs of their own, and a pool
        // block may be written to two slots in one run.
        let writes = [
            write(KvSource::Pool(3), 0),
            write(KvSource::Pool(3), 1),
            write(KvSource::Host(2), 2),
            write(KvSource::Host(1), 3),
            read(2, 3),
        ];
        assert_eq!(run_length(&writes, 8), 2);
        assert_eq!(run_length(&writes[2..], 8), 2);
        assert_eq!(run_length(&writes[4..], 8), 1);
    }
}
