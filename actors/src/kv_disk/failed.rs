//! Disk reads that failed their checks while serving: the backend that made them reports
//! each (the disk slot and the pool block it was to fill), and the KV allocator forgets
//! both before its next step, so a block damaged under a running server fails the one
//! step that read it and later prompts miss it (its pool block, entered in the prefix
//! cache when the read was granted, holds nothing valid).

use std::sync::{Arc, Mutex};

/// One failed read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedRead {
    /// The disk slot read.
    pub slot: u64,
    /// The pool block it was to fill.
    pub block: u32,
}

/// The failed reads not yet taken, shared by the backend and the allocator.
#[derive(Debug, Default)]
pub struct FailedReads(Mutex<Vec<FailedRead>>);

impl FailedReads {
    /// A new, empty list to share.
    pub fn shared() -> Arc<FailedReads> {
        Arc::new(FailedReads::default())
    }

    /// Reports a failed read.
    pub fn report(&self, read: FailedRead) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(read);
    }

    /// The reads reported since the last call.
    pub fn take(&self) -> Vec<FailedRead> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What a backend's disk tier gives the allocator at start-up: its slots, the checked
/// blocks found in it, and where its failed reads are reported.
pub struct DiskTierStart {
    pub slots: u64,
    pub found: Vec<super::FoundBlock>,
    pub failed: Arc<FailedReads>,
}
