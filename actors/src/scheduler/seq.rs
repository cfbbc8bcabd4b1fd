//! A request's state inside the scheduler: its tokens, how many are in the KV cache, its
//! blocks and its timings. What a step does with it is the step's plan
//! ([`super::plan::StepPlan`]), not a field of the sequence.

use crate::messages::{GenerateRequest, RequestEvent, Usage};
use peregrine_config::MAX_SPECULATIVE_TOKENS;
use std::time::Instant;

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Waiting,
    Running,
}

/// One request: its tokens (prompt, then generated), how many are in the cache, and its
/// timings.
pub struct Seq {
    pub req: GenerateRequest,
    /// Arrival order, the tie-breaker after priority.
    pub order: u64,
    pub tokens: Vec<u32>,
    pub num_computed: usize,
    pub block_table: Vec<u32>,
    /// How many of `block_table`'s blocks the target runner holds (it keeps each
    /// sequence's table, and gets only the blocks after these); 0 after a preemption.
    pub blocks_sent: usize,
    /// How many of `tokens` and of `block_table` the draft proposer holds; 0 after a
    /// preemption, when it forgets the sequence.
    pub proposed: (usize, usize),
    /// Blocks the KV allocator holds in its prefix cache for the sequence (reported full,
    /// or found cached at admission): the next report starts after them.
    pub blocks_registered: usize,
    pub phase: Phase,
    /// The runner has the request's sampling state.
    pub setup_sent: bool,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    /// A disk read into one of its blocks failed: held until it can be sent back to wait
    /// (`tier_loads.rs`).
    pub read_failed: bool,
    pub last_token_at: Option<Instant>,
    /// Speculation counts: verifications with drafts, drafts, accepted drafts.
    pub spec: [usize; 3],
    /// Accepted drafts at each draft position.
    pub accepted_per_position: [usize; MAX_SPECULATIVE_TOKENS],
}

impl Seq {
    /// A new waiting request.
    pub fn new(req: GenerateRequest, order: u64) -> Seq {
        Seq {
            tokens: req.spec.prompt.to_vec(),
            req,
            order,
            num_computed: 0,
            block_table: Vec::new(),
            blocks_sent: 0,
            proposed: (0, 0),
            blocks_registered: 0,
            phase: Phase::Waiting,
            setup_sent: false,
            cached_tokens: None,
            read_failed: false,
            last_token_at: None,
            spec: [0; 3],
            accepted_per_position: [0; MAX_SPECULATIVE_TOKENS],
        }
    }

    /// Back to waiting with nothing in the cache (preempted, or a prefix block failed its
    /// read): it recomputes from its tokens, and the runner and the proposer get its whole
    /// new table.
    pub fn reset_to_waiting(&mut self) {
        self.phase = Phase::Waiting;
        self.num_computed = 0;
        self.block_table.clear();
        self.blocks_sent = 0;
        self.proposed = (0, 0);
        self.blocks_registered = 0;
    }

    /// The key that orders requests: priority (lower first), then arrival.
    pub fn key(&self) -> (i32, u64) {
        (self.req.spec.priority, self.order)
    }

    /// Tokens generated so far.
    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.req.spec.prompt.len()
    }

    /// Tokens not yet in the cache.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Whether the sequence decodes (one token not in the cache: the last generated).
    pub fn is_decoding(&self) -> bool {
        self.remaining() == 1
    }

    /// Whether the sequence scores its prompt (`prompt_logprobs`) and has prompt tokens
    /// left to compute whose next token is a prompt token: every row of its chunks is then
    /// a logit row, and it takes nothing from the prefix cache.
    pub fn scores_prompt(&self) -> bool {
        let prompt = self.req.spec.prompt.len();
        self.req.spec.prompt_logprobs.is_some() && self.num_computed + 1 < prompt
    }

    /// Token counts for the response.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.req.spec.prompt.len(),
            completion_tokens: self.output_len(),
            cached_tokens: self.cached_tokens.unwrap_or(0),
            num_drafts: self.spec[0],
            num_draft_tokens: self.spec[1],
            num_accepted_tokens: self.spec[2],
            accepted_per_position: self.accepted_per_position,
        }
    }

    /// Sends an event to the client; false if the client has gone.
    pub fn send(&self, event: RequestEvent) -> bool {
        self.req.events.send(event).is_ok()
    }
}
