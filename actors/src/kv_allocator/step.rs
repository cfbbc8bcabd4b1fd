//! One `AllocateStep`, in order: forget failed disk reads, register computed blocks, free
//! ended sequences, grow the running ones (preempting from the back), admit new ones.

use super::BlockManager;
use crate::messages::{AllocateStep, StepGrant};

impl BlockManager {
    /// Applies one step's message and returns the grant.
    ///
    /// `computed` is applied before `free`, so a sequence that ends in the same message as
    /// its last progress report still leaves its full blocks in the prefix cache. Freed
    /// blocks stay cached until they are reused. Unknown ids in `free` and `computed` are
    /// ignored. In debug builds the invariants are checked afterwards.
    pub fn allocate_step(&mut self, step: AllocateStep) -> StepGrant {
        // The disk tier's start-up entries are announced before the first step or never.
        if let Some(disk) = &mut self.disk {
            disk.take_found();
        }
        self.forget_failed_reads();
        for c in &step.computed {
            self.register_computed(c.id, c.first_block, &c.tokens);
        }
        for &id in &step.free {
            self.release(id);
        }
        let (grown, preempted) = self.grow(&step.grow);
        // As vLLM: a step that had to preempt admits nothing, or the preempted request (first
        // in line) would come straight back and the pool would churn.
        let admitted = if preempted.is_empty() {
            self.admit(&step.admit, step.token_budget, step.scoring_rows)
        } else {
            Vec::new()
        };
        #[cfg(debug_assertions)]
        if let Err(broken) = self.check_invariants() {
            panic!("KV allocator invariant broken after a step: {broken}");
        }
        StepGrant {
            grown,
            preempted,
            admitted,
            usage: self.usage(),
            moves: std::mem::take(&mut self.moves),
        }
    }
}
