//! The disk tier's file worked by a thread of its own, so that the runner never waits on
//! the disk unless it asks to: writes are made in the order they were queued, and a read
//! goes ahead of the writes queued before it except those into its own slot (a request
//! waits for its prefix, not for the blocks other requests' admissions pushed out; a slot
//! written and then read is read as written, a slot read and then written over is read as
//! it was). Each read's bytes (or its failure) come back for the backend to copy into its
//! pool block when it next looks.
//!
//! A read that fails its checks is reported to the KV allocator and its record erased on
//! the thread ([`DiskBlocks::read`]) before its failure comes back. A write that fails is
//! logged: its slot's record then fails a later read's checks, which misses. Dropping the
//! queue waits for the writes queued before it, so a server that stops leaves them on
//! disk for the next one.

use super::blocks::DiskBlocks;
use super::chain::ContentHash;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One queued piece of work.
enum Job {
    Write {
        slot: u64,
        parent: ContentHash,
        tokens: Arc<[u32]>,
        data: Vec<u8>,
    },
    Read {
        slot: u64,
        chain: ContentHash,
        block: u32,
    },
}

/// A finished read: the pool block it is to fill and the checked bytes, or `None` where
/// the slot failed its checks (or the thread is gone) and nothing may be copied.
#[derive(Debug)]
pub struct FinishedRead {
    pub block: u32,
    pub data: Option<Vec<u8>>,
}

/// The queue and its thread.
pub struct DiskQueue {
    jobs: Option<Sender<Job>>,
    finished: Receiver<FinishedRead>,
    /// The pool blocks of the reads queued and not yet handed back.
    pending: Vec<u32>,
    thread: Option<JoinHandle<()>>,
    block_bytes: u64,
}

impl DiskQueue {
    /// Starts the thread that works `disk`.
    pub fn start(disk: DiskBlocks) -> anyhow::Result<DiskQueue> {
        let block_bytes = disk.block_bytes();
        let (jobs, inbox) = crossbeam_channel::unbounded::<Job>();
        let (done, finished) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("kv-disk".into())
            .spawn(move || work(&disk, &inbox, &done))?;
        Ok(DiskQueue {
            jobs: Some(jobs),
            finished,
            pending: Vec::new(),
            thread: Some(thread),
            block_bytes,
        })
    }

    /// Bytes of one block's data.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Queues writing `data` (a block's bytes) into `slot` as the block of `tokens` after
    /// the content chain `parent`.
    pub fn write(&self, slot: u64, parent: &ContentHash, tokens: &Arc<[u32]>, data: Vec<u8>) {
        self.send(Job::Write {
            slot,
            parent: *parent,
            tokens: tokens.clone(),
            data,
        });
    }

    /// Queues reading `slot`, checked to hold the block ending `chain`, for pool block
    /// `block`; its bytes come back from [`DiskQueue::finished`].
    pub fn read(&mut self, slot: u64, chain: &ContentHash, block: u32) {
        self.pending.push(block);
        self.send(Job::Read {
            slot,
            chain: *chain,
            block,
        });
    }

    /// Reads queued and not yet handed back.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The reads finished since the last call; with `wait`, at least one when any is
    /// pending. Once the thread is gone (it panicked), every read still pending comes back
    /// failed.
    pub fn finished(&mut self, wait: bool) -> Vec<FinishedRead> {
        let mut out = Vec::new();
        let mut gone = false;
        if wait && !self.pending.is_empty() {
            match self.finished.recv() {
                Ok(read) => out.push(read),
                Err(_) => gone = true,
            }
        }
        while !gone {
            match self.finished.try_recv() {
                Ok(read) => out.push(read),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => gone = true,
            }
        }
        for read in &out {
            if let Some(at) = self.pending.iter().position(|&b| b == read.block) {
                self.pending.swap_remove(at);
            }
        }
        if gone {
            tracing::error!(
                "the KV disk tier's thread is gone: {} pending reads fail",
                self.pending.len()
            );
            out.extend(
                self.pending
                    .drain(..)
                    .map(|block| FinishedRead { block, data: None }),
            );
        }
        out
    }

    fn send(&self, job: Job) {
        // A thread that is gone has dropped its inbox: a read sent to it comes back failed
        // from `finished`, a write is lost (its slot then fails a later read's checks).
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(job);
        }
    }
}

impl Drop for DiskQueue {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: the jobs in [`next_job`]'s order until the queue is dropped and every job
/// queued is made.
fn work(disk: &DiskBlocks, inbox: &Receiver<Job>, done: &Sender<FinishedRead>) {
    let mut jobs = VecDeque::new();
    loop {
        if jobs.is_empty() {
            match inbox.recv() {
                Ok(job) => jobs.push_back(job),
                Err(_) => return,
            }
        }
        jobs.extend(inbox.try_iter());
        let Some(job) = jobs.remove(next_job(&jobs)) else {
            continue;
        };
        match job {
            Job::Write {
                slot,
                parent,
                tokens,
                data,
            } => {
                if let Err(e) = disk.write(slot, &parent, &tokens, &data) {
                    tracing::warn!("KV disk tier: {e:#}");
                }
            }
            Job::Read { slot, chain, block } => {
                let data = match disk.read(slot, &chain, block) {
                    Ok(data) => Some(data),
                    Err(e) => {
                        tracing::warn!("KV disk tier: {e:#}");
                        None
                    }
                };
                if done.send(FinishedRead { block, data }).is_err() {
                    return;
                }
            }
        }
    }
}

/// Which of `jobs` (oldest first) to make next: the first read that no write queued before
/// it targets the slot of, else the oldest job.
fn next_job(jobs: &VecDeque<Job>) -> usize {
    let mut written = HashSet::new();
    for (at, job) in jobs.iter().enumerate() {
        match job {
            Job::Write { slot, .. } => {
                written.insert(*slot);
            }
            Job::Read { slot, .. } if !written.contains(slot) => return at,
            Job::Read { .. } => {}
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::{next_job, Job};
    use std::collections::VecDeque;
    use std::sync::Arc;

    fn write(slot: u64) -> Job {
        Job::Write {
            slot,
            parent: [0; 32],
            tokens: Arc::from(vec![1u32]),
            data: Vec::new(),
        }
    }

    fn read(slot: u64) -> Job {
        Job::Read {
            slot,
            chain: [0; 32],
            block: slot as u32,
        }
    }

    /// The slots of `jobs` in the order the thread makes them, reads as negative.
    fn order(jobs: Vec<Job>) -> Vec<i64> {
        let mut jobs: VecDeque<Job> = jobs.into();
        let mut made = Vec::new();
        while let Some(job) = jobs.remove(next_job(&jobs)) {
            made.push(match job {
                Job::Write { slot, .. } => slot as i64,
                Job::Read { slot, .. } => -(slot as i64),
            });
        }
        made
    }

    #[test]
    fn reads_go_ahead_of_writes_except_into_their_own_slot() {
        assert_eq!(
            order(vec![
                write(1),
                write(2),
                read(3),
                read(1),
                write(3),
                read(2)
            ]),
            [-3, 1, -1, 2, -2, 3]
        );
        // A read before a write into its slot stays before it.
        assert_eq!(order(vec![read(4), write(4), read(4)]), [-4, 4, -4]);
        assert_eq!(order(vec![write(5), write(6)]), [5, 6]);
    }
}
