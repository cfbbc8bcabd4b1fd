//! Async scheduling beside a drafter that reads the target's hidden states (EAGLE-3): the
//! target runner, driven step by step on the CPU with its layer inputs recorded, must give
//! every step the tokens and the hidden states it gives with nothing queued ahead, when a
//! step comes from the one queued before it, when a verification drops it, when a
//! sequence leaves the batch it was queued for, and when the batch asks for nothing queued.

mod common;

use common::engine::tiny_backend;
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::actor_thread::Spin;
use peregrine_actors::messages::{
    AheadUse, RequestId, SamplingSetup, ScheduledBatch, ScheduledSeq, StepDone,
};
use peregrine_actors::target_runner::{DecodeAhead, TargetRunner, TargetRunnerHandle};
use peregrine_ops::sampling::SamplingParams;
use std::path::Path;
use std::sync::Arc;

/// Blocks each sequence holds: 32 positions.
const BLOCKS_EACH: u32 = 2;

/// A sequence as the test's scheduler sees it.
struct Seq {
    id: RequestId,
    prompt: Vec<u32>,
    output: Vec<u32>,
    /// Whether the runner has its setup and blocks.
    started: bool,
}

impl Seq {
    /// Its step: the prompt the first time, else its last token followed by `drafts`.
    fn scheduled(&mut self, drafts: &[u32]) -> ScheduledSeq {
        let first = self.id.0 as u32 * BLOCKS_EACH;
        let (tokens, num_cached, kept_blocks, new_blocks, setup) = match self.started {
            false => (
                self.prompt.clone(),
                0,
                0,
                (first..first + BLOCKS_EACH).collect(),
                Some(SamplingSetup {
                    params: SamplingParams::greedy(),
                    prompt: Arc::from(self.prompt.as_slice()),
                    logprobs: None,
                    prompt_logprobs: None,
                    max_tokens: 24,
                    grammar: None,
                }),
            ),
            true => {
                let mut tokens = vec![*self.output.last().expect("a token")];
                tokens.extend_from_slice(drafts);
                let cached = self.prompt.len() + self.output.len() - 1;
                (tokens, cached, BLOCKS_EACH as usize, Vec::new(), None)
            }
        };
        self.started = true;
        ScheduledSeq {
            id: self.id,
            tokens,
            num_cached,
            kept_blocks,
            new_blocks,
            sample: true,
            num_drafts: drafts.len(),
            draft_dists: None,
            drafts_on_device: None,
            setup,
        }
    }
}

/// A CPU runner over the tiny model of `dir`, recording the inputs of layers 0 and 1.
fn runner(dir: &Path, ahead: DecodeAhead) -> TargetRunnerHandle {
    let mut backend = tiny_backend(dir, 16);
    backend.record_hidden(&[0, 1]).unwrap();
    TargetRunner::spawn(backend, 16, Spin::NONE, ahead).0
}

/// The same batch through both runners; their replies, which must be equal but for how the
/// step queued ahead served it.
async fn both(
    alone: &TargetRunnerHandle,
    ahead: &TargetRunnerHandle,
    batch: ScheduledBatch,
) -> (StepDone, AheadUse) {
    let want = alone.step(batch.clone()).await.unwrap();
    let got = ahead.step(batch).await.unwrap();
    assert_eq!(want.ahead, AheadUse::None, "step {}", want.step);
    assert_eq!(got.sampled, want.sampled, "step {}: tokens", want.step);
    assert_eq!(got.hidden, want.hidden, "step {}: hidden states", want.step);
    assert!(
        !want.hidden.is_empty(),
        "step {}: nothing recorded",
        want.step
    );
    (want, got.ahead)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_queued_ahead_hand_on_the_hidden_states_each_step_records_alone() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 97).write_hf(dir.path());
    let alone = runner(dir.path(), DecodeAhead::OFF);
    let ahead = runner(
        dir.path(),
        DecodeAhead {
            free: true,
            constrained: false,
        },
    );
    let mut seqs = [
        (0u64, vec![5, 17, 230, 8, 41]),
        (1, vec![9, 99, 3, 150, 77, 12, 6, 281, 40]),
    ]
    .map(|(id, prompt)| Seq {
        id: RequestId(id),
        prompt,
        output: Vec::new(),
        started: false,
    });
    // Prompts, four plain decodes (the last asked to queue nothing), a verification of two
    // drafts for sequence 0 beside a plain decode of sequence 1, two plain decodes, then
    // sequence 1 leaves and sequence 0 decodes alone, verifying again at step 13.
    let mut uses = Vec::new();
    for step in 1..=14u64 {
        let leaves = step == 9;
        let drafts: &[u32] = match step {
            6 => &[7, 8],
            13 => &[250, 3, 9],
            _ => &[],
        };
        let mut batch = ScheduledBatch {
            step,
            seqs: Vec::new(),
            released: Vec::new(),
            kv_moves: Vec::new(),
            queue_ahead: step != 5,
        };
        for (i, seq) in seqs.iter_mut().enumerate() {
            match (i, step >= 9) {
                (1, true) => {
                    if leaves {
                        batch.released.push(seq.id);
                    }
                }
                (0, _) => batch.seqs.push(seq.scheduled(drafts)),
                _ => batch.seqs.push(seq.scheduled(&[])),
            }
        }
        let (done, used) = both(&alone, &ahead, batch).await;
        for out in done.sampled {
            let seq = seqs.iter_mut().find(|s| s.id == out.id).unwrap();
            seq.output.extend(out.tokens.iter().map(|t| t.id));
        }
        uses.push(used);
    }
    // Step 2 queued step 3, which served both; step 5 queued nothing before the
    // verification (step 6); sequence 1's leaving (step 9) dropped the step queued for
    // both; the verification of step 13 dropped the step queued after step 12.
    assert_eq!(uses[2], AheadUse::Served(2), "{uses:?}");
    assert_eq!(uses[4], AheadUse::Served(2), "{uses:?}");
    assert_eq!(uses[5], AheadUse::None, "{uses:?}");
    assert_eq!(uses[8], AheadUse::Dropped, "{uses:?}");
    assert_eq!(uses[10], AheadUse::Served(1), "{uses:?}");
    assert_eq!(uses[12], AheadUse::Dropped, "{uses:?}");
}
