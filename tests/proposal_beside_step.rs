//! A proposal that asks no drafts (a prompt's chunk, decodes planned without drafts) is not
//! waited for: the target's step runs while the proposer takes in what it was sent, and
//! the scheduler waits for that reply before it sends the next proposal. A drafter held
//! inside such a proposal must not hold the step's tokens back, and its failure must
//! still fail the requests.

mod common;

use common::engine::{collect, requests, solo, submit, tiny_backend};
use common::tiny_model::{TinyModel, TinySpec};
use peregrine_actors::draft::{DraftMethod, Ngram};
use peregrine_actors::engine::{start_engine, Engine, EngineSettings};
use peregrine_actors::messages::{
    Drafted, FinishReason, ProposeSeq, RequestEvent, RequestId, SchedulerLimits,
};
use std::path::Path;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

const MAX_TOKENS: usize = 12;

/// What the first proposal that asks no drafts does.
enum Hold {
    /// Waits until the test sends on the channel.
    Until(Mutex<mpsc::Receiver<()>>),
    /// Fails.
    Fail,
}

/// N-gram drafting whose first proposal asking no drafts holds or fails.
struct Held {
    ngram: Ngram,
    hold: Option<Hold>,
}

impl DraftMethod for Held {
    fn propose(&mut self, seqs: &[ProposeSeq]) -> anyhow::Result<Vec<Drafted>> {
        if seqs.iter().all(|s| s.max_drafts == 0) {
            match self.hold.take() {
                Some(Hold::Until(release)) => release.lock().unwrap().recv().unwrap(),
                Some(Hold::Fail) => anyhow::bail!("the drafter failed on purpose"),
                None => {}
            }
        }
        self.ngram.propose(seqs)
    }

    fn release(&mut self, id: RequestId) {
        self.ngram.release(id);
    }
}

fn engine(dir: &Path, drafter: Held) -> Engine {
    let settings = EngineSettings {
        block_size: 16,
        prefix_caching: true,
        limits: SchedulerLimits {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            max_waiting: 100,
            num_speculative_tokens: 3,
            speculative_adaptive: false,
        },
        max_model_len: None,
        async_scheduling: false,
        async_scheduling_constrained: false,
        kv_events: None,
    };
    start_engine(tiny_backend(dir, 64), &settings, Some(Box::new(drafter))).unwrap()
}

fn held(hold: Hold) -> Held {
    Held {
        ngram: Ngram::new(1, 3).unwrap(),
        hold: Some(hold),
    }
}

#[tokio::test]
async fn a_prompts_token_comes_while_its_proposal_is_still_held() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 17).write_hf(dir.path());
    let reqs = requests(300, 1, 5);
    let want = solo(dir.path(), &reqs, MAX_TOKENS);
    let (release, released) = mpsc::channel();
    let method = held(Hold::Until(Mutex::new(released)));
    let engine = engine(dir.path(), method);
    let (prompt, params) = &reqs[0];
    let mut rx = submit(&engine.scheduler, 0, prompt, params, MAX_TOKENS).await;

    // The prompt's step asks no drafts: its token comes while the proposer still holds
    // that proposal (a scheduler waiting for it would never send the token).
    let first = tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the prompt's token waited for a proposal that asked no drafts")
        .expect("the request ended");
    let RequestEvent::Tokens(first) = first else {
        panic!("the first event is not a token");
    };
    assert_eq!(first[0].id, want[0][0]);
    release.send(()).unwrap();

    let (rest, reason, usage) = collect(rx).await;
    assert_eq!(reason, FinishReason::Length);
    let mut tokens = vec![first[0].id];
    tokens.extend(rest);
    assert_eq!(tokens, want[0], "greedy tokens equal the target's alone");
    assert_eq!(usage.completion_tokens, MAX_TOKENS);
    assert!(usage.num_drafts > 0, "the decodes were not drafted for");
}

#[tokio::test]
async fn a_failed_proposal_that_was_not_waited_for_fails_its_requests() {
    let dir = tempfile::tempdir().unwrap();
    TinyModel::random(TinySpec::llama_tiny(), 18).write_hf(dir.path());
    let reqs = requests(300, 1, 6);
    let method = held(Hold::Fail);
    let engine = engine(dir.path(), method);
    let (prompt, params) = &reqs[0];
    let rx = submit(&engine.scheduler, 0, prompt, params, MAX_TOKENS).await;
    let (tokens, reason, _) = tokio::time::timeout(Duration::from_secs(60), collect(rx))
        .await
        .expect("the request never ended");
    assert_eq!(
        reason,
        FinishReason::Error,
        "the proposer's failure was lost"
    );
    assert!(tokens.len() < MAX_TOKENS);
}
