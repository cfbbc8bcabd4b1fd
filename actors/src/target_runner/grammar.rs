//! Constrained requests in the runner: the masks of a step's sampled rows, computed on a
//! host thread while the forward runs, and what a request's grammar does with the tokens
//! the step chose (consumes them, takes back rejected drafts, appends the tokens it
//! forces next).

use std::sync::OnceLock;
use std::time::Instant;

use peregrine_ops::sampling::{Sampler, TokenMask};
use peregrine_structured::{DraftMasks, GrammarMatcher};
use rayon::prelude::*;

use crate::backend::RowMasks;
use crate::messages::{GeneratedToken, GrammarStatus};
use crate::metrics;

/// The threads that compute a step's masks, one row each at a time: at most 8 (a batch's
/// masks take the longest row's time, not their sum), apart from the pool the CPU
/// forward runs on.
fn mask_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("grammar-mask-{i}"))
            .build()
            .expect("the grammar mask threads could not start")
    })
}

/// One mask per sampled row: each constrained row's, `None` for the others, computed on
/// the mask threads. A row whose grammar cannot give a mask is left unmasked; its matcher
/// keeps the failure, which [`after_tokens`] reports.
pub fn row_masks(grammars: Vec<Option<&mut GrammarMatcher>>) -> Vec<Option<TokenMask>> {
    mask_pool().install(|| {
        grammars
            .into_par_iter()
            .map(|grammar| {
                let grammar = grammar?;
                let started = Instant::now();
                let mask = grammar.mask().ok();
                metrics::record_grammar_mask(started.elapsed());
                mask
            })
            .collect()
    })
}

/// The masks of a step's sampled rows (one entry of `grammars` each) as the backend takes
/// them: computed by [`row_masks`] on a thread of `scope` while the forward runs, or none
/// when no row is constrained.
pub fn masks_of<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    grammars: Vec<Option<&'scope mut GrammarMatcher>>,
) -> RowMasks<'scope> {
    match grammars.iter().any(Option::is_some) {
        true => RowMasks::Pending(scope.spawn(move || Ok(row_masks(grammars)))),
        false => RowMasks::None,
    }
}

/// The masks of each verifying sequence's rows over its drafts (`None`: unconstrained, or
/// its grammar failed, which its matcher keeps), one sequence per mask thread at a time.
pub fn verification_masks(
    seqs: Vec<(Option<&mut GrammarMatcher>, &[u32])>,
) -> Vec<Option<DraftMasks>> {
    mask_pool().install(|| {
        seqs.into_par_iter()
            .map(|(grammar, drafts)| {
                let grammar = grammar?;
                let started = Instant::now();
                let masks = grammar.draft_masks(drafts).ok();
                if let Some(masks) = &masks {
                    let each = started.elapsed() / masks.masks.len().max(1) as u32;
                    for _ in &masks.masks {
                        metrics::record_grammar_mask(each);
                    }
                }
                masks
            })
            .collect()
    })
}

/// What a request's grammar does after a step chose `tokens` for it (after `admitted`
/// drafts the grammar had consumed for the verification, `accepted` of which were
/// accepted): it moves past them and, where it then forces tokens, appends them to
/// `tokens` and `output` (at most `room` of them; none when the request wants logprobs,
/// which forced tokens would lack). A sampled request draws one uniform per forced token,
/// so that its random stream stays where sampling each of them would have left it.
pub struct Chosen<'a> {
    pub grammar: &'a mut GrammarMatcher,
    pub sampler: &'a mut Sampler,
    pub tokens: &'a mut Vec<GeneratedToken>,
    pub output: &'a mut Vec<u32>,
    pub admitted: usize,
    pub accepted: usize,
    pub room: usize,
    pub fast_forward: bool,
}

/// Applies [`Chosen`] and says where the grammar stands.
pub fn after_tokens(chosen: Chosen) -> GrammarStatus {
    let Chosen {
        grammar,
        sampler,
        tokens,
        output,
        admitted,
        accepted,
        room,
        fast_forward,
    } = chosen;
    if let Some(failure) = grammar.failure() {
        return GrammarStatus::Failed(failure.to_owned());
    }
    let Some(last) = tokens.last().map(|t| t.id) else {
        return GrammarStatus::Failed("the step chose no token".into());
    };
    if let Err(err) = grammar.settle(admitted, accepted, last) {
        return GrammarStatus::Failed(err);
    }
    if grammar.is_stopped() {
        return GrammarStatus::Complete;
    }
    if fast_forward && room > 0 {
        let mut forced = grammar.forced();
        forced.truncate(room);
        if !forced.is_empty() {
            metrics::record_forced_tokens(forced.len());
            for &id in &forced {
                sampler.next_uniform();
                tokens.push(GeneratedToken { id, logprobs: None });
            }
            output.extend(&forced);
        }
        if grammar.is_stopped() {
            return GrammarStatus::Complete;
        }
    }
    GrammarStatus::Open
}
