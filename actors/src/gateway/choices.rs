//! Several choices in one response (OpenAI's `n`, vLLM's parallel sampling, and one per
//! prompt of a completions request's list of prompts), each a request of its own to the
//! engine, with the request's `seed` plus its index (so that a seeded request repeats, and
//! its choices differ). A prompt's first choice is submitted at once and the others once it
//! has its first tokens: its prompt's full blocks are then in the prefix cache, so the
//! others share those blocks rather than computing them again, and compute only the
//! prompt's last partial block (as vLLM's children do). Usage is summed as OpenAI sums it:
//! each prompt counted once, every choice's completion added.

use futures_util::future::try_join_all;

use super::context::RequestContext;
use super::errors::ApiError;
use super::generation::{Generation, Output};
use super::params::Plan;
use super::peer::PeerProbe;
use super::protocol::response::{PromptTokensDetails, SpecDecodeDetails, UsageOut};
use super::state::GatewayState;

/// The generations of one response, in choice order: `per_prompt` consecutive choices
/// for each prompt.
pub struct Choices {
    /// One per choice.
    pub generations: Vec<Generation>,
    /// Choices per prompt (`n`).
    pub per_prompt: usize,
}

impl Choices {
    /// Submits `plan.n` choices of each of `plans` (one per prompt, in order; at least
    /// one) as the request of `context`: every prompt's first choice at once, the others
    /// once their prompt's first choice has its first tokens.
    pub async fn start(
        state: &GatewayState,
        context: &RequestContext,
        plans: Vec<Plan>,
    ) -> Result<Choices, ApiError> {
        let n = plans.first().map_or(1, |plan| plan.n);
        let mut firsts = Vec::with_capacity(plans.len());
        for (prompt, plan) in plans.iter().enumerate() {
            let first = match prompt {
                0 => Generation::start(state, context, choice(plan, 0)).await?,
                _ => {
                    let public_id = format!("{}-p{prompt}", context.public_id);
                    let id = state.engine.next_id();
                    Generation::start_as(state, id, &public_id, choice(plan, 0)).await?
                }
            };
            firsts.push(first);
        }
        if n > 1 {
            for first in &mut firsts {
                first.started().await;
            }
        }
        let mut generations = Vec::with_capacity(plans.len() * n);
        for (prompt, (plan, first)) in plans.iter().zip(firsts).enumerate() {
            generations.push(first);
            for index in 1..n {
                let id = state.engine.next_id();
                let public_id = format!("{}-p{prompt}-{index}", context.public_id);
                let plan = choice(plan, index);
                generations.push(Generation::start_as(state, id, &public_id, plan).await?);
            }
        }
        Ok(Choices {
            generations,
            per_prompt: n,
        })
    }

    /// The one choice of a request that cannot ask for more (the Messages and Responses
    /// APIs).
    pub fn single(self) -> Generation {
        let mut generations = self.generations;
        generations.truncate(1);
        generations
            .pop()
            .expect("a request has at least one choice")
    }

    /// Reads every choice to its end, together, or gives up (dropping them all, which
    /// cancels them) as soon as `peer` says the client has gone; with the usage of them all
    /// ([`summed`]).
    pub async fn collect_while_connected(
        self,
        peer: Option<PeerProbe>,
    ) -> Result<(Vec<Output>, UsageOut), ApiError> {
        let per_prompt = self.per_prompt;
        let outputs = self.collect_all(peer).await?;
        let usages: Vec<UsageOut> = outputs.iter().map(|o| o.usage.clone()).collect();
        Ok((outputs, summed(&usages, per_prompt)))
    }

    /// Every choice's output, read together, unless the client goes.
    async fn collect_all(self, peer: Option<PeerProbe>) -> Result<Vec<Output>, ApiError> {
        let all = try_join_all(self.generations.into_iter().map(Generation::collect));
        let Some(peer) = peer else {
            return all.await;
        };
        tokio::select! {
            outputs = all => outputs,
            () = peer.closed_wait() => {
                tracing::info!("client closed the connection; request cancelled");
                Err(ApiError::bad_request("the client closed the connection"))
            }
        }
    }
}

/// `plan` as its choice `index`: its seed, if it has one, moved on by `index`.
fn choice(plan: &Plan, index: usize) -> Plan {
    let mut plan = plan.clone();
    let params = &mut plan.submission.params;
    params.seed = params.seed.map(|seed| seed.wrapping_add(index as u64));
    plan
}

/// The usage of a response whose choices used `usages`, `per_prompt` consecutive ones
/// for each prompt: each prompt's tokens (and cache hits) counted once, from its first
/// choice; every choice's completion tokens and speculation counts added.
pub fn summed(usages: &[UsageOut], per_prompt: usize) -> UsageOut {
    let firsts = usages.iter().step_by(per_prompt.max(1));
    let prompt_tokens = firsts.clone().map(|u| u.prompt_tokens).sum();
    let cached = firsts
        .map(|u| u.prompt_tokens_details.as_ref().map(|d| d.cached_tokens))
        .sum::<Option<usize>>();
    let completion_tokens = usages.iter().map(|u| u.completion_tokens).sum();
    let spec = usages
        .iter()
        .map(|u| u.spec_decode_details.clone())
        .sum::<Option<SpecDecodeDetails>>();
    UsageOut {
        prompt_tokens_details: cached.map(|cached_tokens| PromptTokensDetails { cached_tokens }),
        spec_decode_details: spec,
        ..UsageOut::counted(prompt_tokens, completion_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: usize, completion: usize, cached: Option<usize>) -> UsageOut {
        UsageOut {
            prompt_tokens_details: cached
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
            ..UsageOut::counted(prompt, completion)
        }
    }

    #[test]
    fn each_prompt_counts_once_and_every_completion_adds() {
        // Two prompts of three choices each.
        let usages = [
            usage(10, 4, Some(0)),
            usage(10, 5, Some(8)),
            usage(10, 6, Some(8)),
            usage(7, 1, Some(0)),
            usage(7, 2, Some(0)),
            usage(7, 3, Some(0)),
        ];
        let sum = summed(&usages, 3);
        assert_eq!(sum.prompt_tokens, 17);
        assert_eq!(sum.completion_tokens, 21);
        assert_eq!(sum.total_tokens, 38);
        assert_eq!(sum.prompt_tokens_details.unwrap().cached_tokens, 0);
        assert!(sum.spec_decode_details.is_none());
        // One choice: its own usage.
        assert_eq!(summed(&usages[1..2], 1), usages[1]);
        // A choice without cache details leaves them out.
        let sum = summed(&[usage(3, 1, None), usage(3, 1, Some(2))], 1);
        assert!(sum.prompt_tokens_details.is_none());
    }

    #[test]
    fn speculation_counts_add_up() {
        let with = |drafts| UsageOut {
            spec_decode_details: Some(SpecDecodeDetails {
                num_drafts: drafts,
                num_draft_tokens: 3 * drafts,
                num_accepted_tokens: drafts,
            }),
            ..UsageOut::counted(5, 9)
        };
        let sum = summed(&[with(2), with(5)], 2);
        let spec = sum.spec_decode_details.unwrap();
        assert_eq!(
            (
                spec.num_drafts,
                spec.num_draft_tokens,
                spec.num_accepted_tokens
            ),
            (7, 21, 7)
        );
        assert_eq!(sum.prompt_tokens, 5);
        assert_eq!(sum.completion_tokens, 18);
    }
}
