//! How many drafts each decoding request is planned for in a step, decided from what the
//! engine's own steps measured (`speculative_adaptive`, on by default).
//!
//! Drafting pays while verifying 1 + k tokens per request costs less than the accepted
//! drafts save. At batch 1 a step is bound by reading the weights and a few more rows
//! cost little; at a large batch the step is bound by compute, verifying k more rows per
//! request costs about what decoding them would, and drafting stops paying. So the
//! controller estimates, for each k from 0 to `num_speculative_tokens`:
//! - the wall time of a decode step with k planned (the proposal, the target's forward
//!   and the host work around them), an exponential moving average per decode batch size
//!   (in powers of two: 1, 2-3, 4-7, ...), over the steps that computed nothing else;
//! - the tokens a decoding request emits per step with k planned, a moving average over
//!   the steps of every batch size (acceptance depends on the text, not on the batch). A
//!   step planned with k also measures every smaller k: a request that accepted `a` of
//!   its drafts would have emitted 1 + min(a, k') with k' planned, since drafts form a
//!   chain;
//!
//! and plans the k with the most tokens per second. Each batch size first measures every
//! k once (the configured one first, then none); after that a step of the size now and
//! then re-measures the k whose cost it measured longest ago, so that a change in cost or
//! in acceptance is seen: 16 steps after the last re-measurement, twice as many after
//! each that left the best k as it was (up to 256), and 16 again once the best k changes.
//! A re-measurement of drafting plans it for two steps: the first after steps without
//! drafts may catch EAGLE-3's head up on the rows that waited (`Drafts::caught_up`), and
//! the scheduler records no cost for such a step.
//! A re-measurement costs what the worse k does (at a large batch a drafting step costs
//! several plain ones, and with EAGLE-3 it also catches the head up on the steps it
//! skipped), so a size whose best k holds pays for few. A greedy request's output does
//! not depend on the drafts it got.

use std::time::Duration;

/// Steps of one batch size between two re-measurements, at first and once the best k
/// changes.
const EXPLORE_EVERY: u64 = 16;
/// The most steps between two re-measurements, which double while the best k holds.
const EXPLORE_EVERY_MAX: u64 = 256;
/// Weight of a new step in a cost's moving average.
const COST_WEIGHT: f64 = 0.25;
/// Weight of one step in the moving average of tokens per request: an average fed after
/// `s` steps without news takes `1 - (1 - w)^s` of the new step (at most a half), so an
/// estimate that only re-measurements feed still follows within a few of them.
const TOKENS_WEIGHT: f64 = 0.05;

/// A moving average and the step it was last fed.
#[derive(Clone, Copy, Debug)]
struct Average {
    value: f64,
    last_step: u64,
}

impl Average {
    fn feed(slot: &mut Option<Average>, sample: f64, weight: f64, step: u64) {
        *slot = Some(match *slot {
            None => Average {
                value: sample,
                last_step: step,
            },
            Some(a) => Average {
                value: a.value + weight * (sample - a.value),
                last_step: step,
            },
        });
    }
}

/// What one decode batch size measured.
#[derive(Clone, Debug, Default)]
struct SizeCosts {
    /// Seconds per step by k planned.
    seconds: Vec<Option<Average>>,
    /// Decisions made for this size.
    steps: u64,
    /// The step of the last re-measurement, and the steps until the next.
    explored_at: u64,
    explore_every: u64,
    /// The best k at the last decision.
    best: Option<usize>,
    /// A re-measured k planned again at the next step: the first step of a k after a
    /// pause may catch the drafter up, which teaches no cost (`DecodeStep::elapsed`).
    again: Option<usize>,
}

/// The adaptive draft-count controller.
#[derive(Debug)]
pub struct DraftControl {
    max_drafts: usize,
    adaptive: bool,
    /// Per batch-size class ([`size_class`]).
    sizes: Vec<SizeCosts>,
    /// Tokens a request emits per step by k planned.
    tokens: Vec<Option<Average>>,
    /// Steps recorded, the clock of `last_step`.
    clock: u64,
}

/// What a decode step measured, for [`DraftControl::record`].
#[derive(Clone, Debug)]
pub struct DecodeStep<'a> {
    /// Decoding requests in the step.
    pub requests: usize,
    /// Drafts planned per request.
    pub planned: usize,
    /// The step's wall time, when it computed nothing but decodes (else `None`).
    pub elapsed: Option<Duration>,
    /// Accepted drafts of each request that verified drafts.
    pub accepted: &'a [usize],
}

/// The class of a decode batch of `n` requests: 0 for 1, 1 for 2-3, 2 for 4-7, ...
pub fn size_class(n: usize) -> usize {
    n.max(1).ilog2() as usize
}

/// The label of a size class, its batch sizes: `1`, `2-3`, `4-7`, ...
pub fn size_class_label(class: usize) -> String {
    let low = 1usize << class;
    if low == 1 {
        "1".to_string()
    } else {
        format!("{low}-{}", 2 * low - 1)
    }
}

impl DraftControl {
    /// A controller planning up to `max_drafts` per request; `adaptive == false` always
    /// plans `max_drafts`.
    pub fn new(max_drafts: usize, adaptive: bool) -> DraftControl {
        DraftControl {
            max_drafts,
            adaptive,
            sizes: Vec::new(),
            tokens: vec![None; max_drafts + 1],
            clock: 0,
        }
    }

    /// Takes new limits; what was measured for draft counts past a lower maximum goes.
    pub fn reconfigure(&mut self, max_drafts: usize, adaptive: bool) {
        if max_drafts != self.max_drafts {
            self.tokens.resize(max_drafts + 1, None);
            for size in &mut self.sizes {
                size.seconds.truncate(max_drafts + 1);
            }
        }
        self.max_drafts = max_drafts;
        self.adaptive = adaptive;
    }

    /// The drafts to plan per request for a step that decodes `requests` requests.
    pub fn plan(&mut self, requests: usize) -> usize {
        if !self.adaptive || requests == 0 {
            return self.max_drafts;
        }
        let class = size_class(requests);
        if self.sizes.len() <= class {
            self.sizes.resize(class + 1, SizeCosts::default());
        }
        let k_max = self.max_drafts;
        let size = &mut self.sizes[class];
        size.seconds.resize(k_max + 1, None);
        size.steps += 1;
        if let Some(k) = size.again.take() {
            return k;
        }
        // Measure each k once: the configured one first, then none, then the rest.
        let order = std::iter::once(k_max).chain(0..k_max);
        let untried = order.clone().find(|&k| size.seconds[k].is_none());
        let best = (0..=k_max).max_by(|&a, &b| {
            let rate = |k: usize| rate(&self.tokens, &size.seconds, k);
            rate(a).total_cmp(&rate(b)).then(b.cmp(&a))
        });
        if size.best != best || size.explore_every == 0 {
            size.explore_every = EXPLORE_EVERY;
            size.explored_at = size.steps;
        }
        size.best = best;
        match (untried, best) {
            (Some(k), _) => k,
            (None, Some(best)) if size.steps - size.explored_at >= size.explore_every => {
                size.explored_at = size.steps;
                size.explore_every = (2 * size.explore_every).min(EXPLORE_EVERY_MAX);
                let k = order
                    .filter(|&k| k != best)
                    .min_by_key(|&k| size.seconds[k].map_or(0, |a| a.last_step))
                    .unwrap_or(best);
                size.again = (k > 0).then_some(k);
                k
            }
            (None, best) => best.unwrap_or(k_max),
        }
    }

    /// Feeds what a decode step planned with [`DraftControl::plan`] measured.
    pub fn record(&mut self, step: &DecodeStep) {
        if !self.adaptive || step.requests == 0 || step.planned > self.max_drafts {
            return;
        }
        self.clock += 1;
        let n = step.requests as f64;
        for k in 0..=step.planned {
            let extra: usize = step.accepted.iter().map(|&a| a.min(k)).sum();
            let sample = 1.0 + extra as f64 / n;
            // Past 64 quiet steps the weight is at its cap anyway.
            let quiet = self.tokens[k].map_or(1, |a| (self.clock - a.last_step).min(64));
            let weight = (1.0 - (1.0 - TOKENS_WEIGHT).powi(quiet as i32)).min(0.5);
            Average::feed(&mut self.tokens[k], sample, weight, self.clock);
        }
        let (Some(elapsed), Some(size)) =
            (step.elapsed, self.sizes.get_mut(size_class(n as usize)))
        else {
            return;
        };
        if let Some(slot) = size.seconds.get_mut(step.planned) {
            Average::feed(slot, elapsed.as_secs_f64(), COST_WEIGHT, self.clock);
        }
    }
}

/// Estimated tokens per second per request with k planned: untried k count as the best.
fn rate(tokens: &[Option<Average>], seconds: &[Option<Average>], k: usize) -> f64 {
    // A k whose tokens no step measured yet is taken to accept every draft.
    let tokens = tokens[k].map_or(1.0 + k as f64, |a| a.value);
    match seconds[k] {
        Some(s) if s.value > 0.0 => tokens / s.value,
        _ => f64::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated engine: a step of `n` requests with k drafts each costs
    /// `fixed + per_row * n * (1 + k)` seconds, and each draft is accepted with `accept`
    /// (a chain: the first rejection ends it), drawn from a seeded generator.
    struct Sim {
        fixed: f64,
        per_row: f64,
        accept: f64,
        state: u64,
        /// What a drafting step after one without drafts adds (EAGLE-3's head catching
        /// up); the scheduler records no cost for such a step.
        catch_up: f64,
        last_k: usize,
    }

    impl Sim {
        fn uniform(&mut self) -> f64 {
            self.state = self
                .state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.state >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Runs `steps` steps of `n` requests; returns the tokens per second overall.
        fn run(&mut self, control: &mut DraftControl, n: usize, steps: usize) -> f64 {
            let (mut tokens, mut seconds) = (0usize, 0.0);
            for _ in 0..steps {
                let k = control.plan(n);
                let accepted: Vec<usize> = (0..n)
                    .map(|_| (0..k).take_while(|_| self.uniform() < self.accept).count())
                    .collect();
                // Timing noise of up to 5%.
                let mut cost = (self.fixed + self.per_row * (n * (1 + k)) as f64)
                    * (1.0 + 0.05 * self.uniform());
                let caught_up = k > 0 && self.last_k == 0 && self.catch_up > 0.0;
                if caught_up {
                    cost += self.catch_up;
                }
                self.last_k = k;
                tokens += n + accepted.iter().sum::<usize>();
                seconds += cost;
                let accepted: Vec<usize> = accepted.into_iter().filter(|_| k > 0).collect();
                control.record(&DecodeStep {
                    requests: n,
                    planned: k,
                    elapsed: (!caught_up).then(|| Duration::from_secs_f64(cost)),
                    accepted: &accepted,
                });
            }
            tokens as f64 / seconds
        }
    }

    fn sim(fixed: f64, per_row: f64, accept: f64, seed: u64) -> Sim {
        Sim {
            fixed,
            per_row,
            accept,
            state: seed,
            catch_up: 0.0,
            last_k: 0,
        }
    }

    /// The tokens per second of always planning `k`, by running the simulation with it.
    fn fixed_rate(fixed: f64, per_row: f64, accept: f64, n: usize, k: usize) -> f64 {
        let mut control = DraftControl::new(k, false);
        sim(fixed, per_row, accept, 7).run(&mut control, n, 2000)
    }

    #[test]
    fn drafts_fully_where_rows_are_cheap_and_none_where_they_cost_their_share() {
        // Batch 1: the step is mostly fixed cost, drafting pays. Batch 64: the step is
        // mostly rows, a 70% chain costs more rows than it saves.
        let mut control = DraftControl::new(3, true);
        let mut s = sim(1e-3, 0.1e-3, 0.7, 1);
        s.run(&mut control, 1, 200);
        // k = 2 and 3 are within 7% of each other at batch 1.
        assert!(control.plan(1) >= 2);
        s.run(&mut control, 64, 200);
        assert_eq!(control.plan(64), 0, "batch 64");
        assert!(control.plan(1) >= 2, "batch 1 keeps its own costs");
        // It gets nearly the throughput of the best fixed choice at each size.
        for n in [1, 64] {
            let best = (0..=3)
                .map(|k| fixed_rate(1e-3, 0.1e-3, 0.7, n, k))
                .fold(0.0, f64::max);
            let mut control = DraftControl::new(3, true);
            let got = sim(1e-3, 0.1e-3, 0.7, 3).run(&mut control, n, 2000);
            assert!(
                got > 0.93 * best,
                "batch {n}: {got:.1} vs best {best:.1} tok/s"
            );
        }
    }

    #[test]
    fn where_drafting_does_not_pay_re_measuring_it_costs_little() {
        // Batch 64: a drafting step costs up to 3.6 plain ones and saves less. Every 16th
        // step re-measuring cost 3.4% of the throughput here; backing off, under 2%.
        let best = fixed_rate(1e-3, 0.1e-3, 0.7, 64, 0);
        let mut control = DraftControl::new(3, true);
        let got = sim(1e-3, 0.1e-3, 0.7, 5).run(&mut control, 64, 5000);
        assert!(
            got > 0.98 * best,
            "{got:.1} vs never drafting {best:.1} tok/s"
        );
    }

    #[test]
    fn a_step_that_catches_the_head_up_teaches_acceptance_not_cost() {
        // Batch 4, where drafting pays: the first drafting step after one without drafts
        // costs 20 ms more (the head's step 0 over the rows that waited). Were that cost
        // taken for the k's, drafting would look dearer than it is whenever it is tried.
        let best = fixed_rate(1e-3, 0.1e-3, 0.7, 4, 3);
        let mut control = DraftControl::new(3, true);
        let mut s = sim(1e-3, 0.1e-3, 0.7, 6);
        s.catch_up = 20e-3;
        s.run(&mut control, 4, 300);
        let got = s.run(&mut control, 4, 2000);
        assert!(
            got > 0.9 * best,
            "{got:.1} vs always drafting {best:.1} tok/s"
        );
        assert!(control.plan(4) >= 2);
    }

    #[test]
    fn a_head_that_stops_agreeing_stops_being_run_and_is_tried_again() {
        let mut control = DraftControl::new(3, true);
        let mut s = sim(10e-3, 1e-3, 0.8, 2);
        s.run(&mut control, 1, 300);
        assert!(control.plan(1) >= 2);
        // Acceptance collapses: drafting only costs.
        s.accept = 0.0;
        s.run(&mut control, 1, 300);
        let planned: Vec<usize> = (0..32).map(|_| control.plan(1)).collect();
        let drafting = planned.iter().filter(|&&k| k > 0).count();
        assert!(drafting <= 2, "still drafting: {planned:?}");
        // It recovers: the periodic re-measurements see it.
        s.accept = 0.8;
        // Its re-measurements come up to 256 steps apart by now.
        s.run(&mut control, 1, 1200);
        let planned: Vec<usize> = (0..32).map(|_| control.plan(1)).collect();
        let drafting = planned.iter().filter(|&&k| k >= 2).count();
        assert!(drafting >= 30, "not drafting again: {planned:?}");
    }

    #[test]
    fn every_k_is_measured_first_the_configured_one_first() {
        let mut control = DraftControl::new(2, true);
        let mut planned = Vec::new();
        for _ in 0..3 {
            let k = control.plan(5);
            planned.push(k);
            control.record(&DecodeStep {
                requests: 5,
                planned: k,
                elapsed: Some(Duration::from_millis(10)),
                accepted: &[],
            });
        }
        assert_eq!(planned, vec![2, 0, 1]);
    }

    #[test]
    fn steps_with_other_work_teach_acceptance_but_not_cost() {
        let mut control = DraftControl::new(1, true);
        assert_eq!(control.plan(1), 1);
        control.record(&DecodeStep {
            requests: 1,
            planned: 1,
            elapsed: None,
            accepted: &[1],
        });
        // No cost for k = 1 yet: still measuring it.
        assert_eq!(control.plan(1), 1);
        assert_eq!(control.tokens[1].map(|a| a.value), Some(2.0));
    }

    #[test]
    fn off_it_always_plans_the_configured_drafts() {
        let mut control = DraftControl::new(4, false);
        let mut s = sim(1e-3, 1e-3, 0.0, 3);
        s.run(&mut control, 64, 50);
        assert_eq!(control.plan(64), 4);
        assert!(control.sizes.is_empty() && control.tokens.iter().all(Option::is_none));
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        let classes: Vec<usize> = [1, 2, 3, 4, 7, 8, 64, 65].map(size_class).to_vec();
        assert_eq!(classes, vec![0, 1, 1, 2, 2, 3, 6, 6]);
        assert_eq!(size_class_label(0), "1");
        assert_eq!(size_class_label(6), "64-127");
    }
}
