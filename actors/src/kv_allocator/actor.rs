//! The KV allocator actor: a tokio task that owns the [`BlockManager`] and answers one
//! `AllocateStep` per scheduler step.

use super::BlockManager;
use crate::kv_events::KvEventSink;
use crate::messages::{AllocateStep, KvMsg, StepGrant};
use anyhow::anyhow;
use tokio::sync::{mpsc, oneshot};

/// Messages that may wait in the actor's mailbox (the scheduler sends one per step).
const MAILBOX: usize = 16;

/// The actor: owns the block pool and serves [`KvMsg`]s until every handle is dropped.
pub struct KvAllocator {
    manager: BlockManager,
    inbox: mpsc::Receiver<KvMsg>,
    /// Where each step's prefix-cache changes go, when they are published.
    events: Option<KvEventSink>,
}

/// How the other actors reach the KV allocator; cheap to clone.
#[derive(Clone, Debug)]
pub struct KvAllocatorHandle {
    outbox: mpsc::Sender<KvMsg>,
    num_blocks: u32,
    block_size: usize,
}

impl KvAllocator {
    /// Starts the actor on the current tokio runtime over a pool of `num_blocks` blocks of
    /// `block_size` tokens, with prefix caching on or off.
    ///
    /// # Panics
    /// Outside a tokio runtime, or if `block_size` is 0.
    pub fn spawn(num_blocks: u32, block_size: usize, prefix_caching: bool) -> KvAllocatorHandle {
        let manager = BlockManager::new(num_blocks, block_size, prefix_caching);
        KvAllocator::spawn_over(manager, None)
    }

    /// Starts the actor on the current tokio runtime over `manager`; with `events`, the
    /// stores of the entries a disk tier found at start-up go there at once, and the
    /// prefix cache's changes of each step as one batch.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_over(manager: BlockManager, events: Option<KvEventSink>) -> KvAllocatorHandle {
        let (outbox, inbox) = mpsc::channel(MAILBOX);
        let (num_blocks, block_size) = (manager.num_blocks(), manager.block_size);
        let manager = match &events {
            Some(sink) => {
                let mut manager = manager.recording_events();
                sink.send(manager.take_events());
                manager
            }
            None => manager,
        };
        let actor = KvAllocator {
            manager,
            inbox,
            events,
        };
        tokio::spawn(actor.run());
        KvAllocatorHandle {
            outbox,
            num_blocks,
            block_size,
        }
    }

    async fn run(mut self) {
        while let Some(msg) = self.inbox.recv().await {
            match msg {
                KvMsg::AllocateStep(step, reply) => {
                    let grant = self.manager.allocate_step(step);
                    if let Err(grant) = reply.send(grant) {
                        // Nobody learned of these admissions: undo them, so the blocks
                        // do not leak and the sequences are simply admitted again later.
                        for seq in &grant.admitted {
                            self.manager.release(seq.id);
                        }
                    }
                    if let Some(events) = &self.events {
                        events.send(self.manager.take_events());
                    }
                }
            }
        }
    }
}

impl KvAllocatorHandle {
    /// Sends one step's allocation request and waits for the grant; an error if the actor
    /// has stopped.
    pub async fn allocate_step(&self, step: AllocateStep) -> anyhow::Result<StepGrant> {
        let (reply, grant) = oneshot::channel();
        self.outbox
            .send(KvMsg::AllocateStep(step, reply))
            .await
            .map_err(|_| anyhow!("the KV allocator has stopped"))?;
        grant
            .await
            .map_err(|_| anyhow!("the KV allocator stopped before answering"))
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
}
