//! The disk tier's file worked by a thread of its own, so that the runner never waits on
//! the disk unless it asks to: writes and checked reads are made one after the other in
//! the order they were queued (a slot read and then written over in a later step is read
//! as it was), and each read's bytes (or its failure) come back in that order for the
//! backend to copy into its pool block when it next looks.
//!
//! A read that fails its checks is reported to the KV allocator and its record erased on
//! the thread ([`DiskBlocks::read`]) before its failure comes back. A write that fails is
//! logged: its slot's record then fails a later read's checks, which misses. Dropping the
//! queue waits for the writes queued before it, so a server that stops leaves them on
//! disk for the next one.

use super::blocks::DiskBlocks;
use super::chain::ContentHash;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::collections::VecDeque;
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
    /// The pool blocks of the reads queued and not yet handed back, oldest first.
    pending: VecDeque<u32>,
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
            pending: VecDeque::new(),
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
        self.pending.push_back(block);
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

    /// The reads finished since the last call, in the order they were queued; with
    /// `wait`, at least one when any is pending. Once the thread is gone (it panicked),
    /// every read still pending comes back failed.
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
            let queued = self.pending.pop_front();
            debug_assert_eq!(queued, Some(read.block), "reads come back in order");
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

/// The thread: each job in turn until the queue is dropped.
fn work(disk: &DiskBlocks, inbox: &Receiver<Job>, done: &Sender<FinishedRead>) {
    for job in inbox {
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
