//! How many drafts each decoding request is planned for in a step, decided from what the
//! engine's own steps measured (`speculative_adaptive`, on by default).
//!
//! Drafting pays while verifying 1 + k tokens per request costs less than the accepted
//! drafts save. At batch 1 a step is bound by reading the weights and a few more rows
//! cost little; at a large batch the step is bound by compute, verifying k more rows per
//! request costs about what decoding them would, and drafting stops paying. So the
//! controller estimates, for each k from 0 to `num_speculative_tokens`:
//! - the wall time of a decode step of n requests with k planned (the proposal, the
//!   target's forward and the host work around them), over the steps that computed nothing
//!   else. Each batch-size class (powers of two: 1, 2-3, 4-7, ...) keeps a moving average
//!   of its steps' sizes and times per k, a point of a curve; the cost at n is the curve
//!   through the points around it (linear between them, flat past the last), so that
//!   batches of 63 and 64, in two classes, see nearly one cost, and a k measured at one
//!   size informs the sizes near it. A new class's first two steps keep the cheaper (the
//!   first step of a size may warm something up), and a later step counts as 0.8 to
//!   1.25 times the cost it was expected to have, a tenth of the average (a step now and
//!   then takes longer on a busy machine, and a plain step's cost, fed every step, must
//!   not swing past a drafting k's, fed now and then);
//! - the tokens a decoding request emits per step with k planned, a moving average over
//!   the steps of every batch size (acceptance depends on the text, not on the batch). A
//!   step planned with k also measures every smaller k: a request that accepted `a` of
//!   its drafts would have emitted 1 + min(a, k') with k' planned, since drafts form a
//!   chain;
//! - what a step costs beyond its k when the proposal catches up: EAGLE-3's head lets
//!   the rows of requests planned without drafts wait, and runs them in the next step that
//!   drafts (it also runs a new prompt's rows); such a step teaches acceptance and this
//!   extra, not the cost of its k.
//!
//! It plans the k with the most tokens per second, except that going from drafting to not
//! drafting or back (which makes, or pays, a catch-up) needs the better k to save more
//! than a catch-up costs over the steps the choice is expected to hold (the steps until
//! the next re-measurement, at most [`SWITCH_HORIZON_MAX`]), starting to draft needs it
//! to beat none by [`START_MARGIN`] (the estimates' noise), and a re-measurement returns
//! to the state chosen before it unless what it measured is worth such a switch. Each
//! class first measures the k its curves do not cover from none upwards, one more draft
//! only while the last one measured paid more than the one below it (tokens per second
//! rise to one peak and fall past it, and a k past the peak costs most where drafting
//! pays least: at batch 64 on the CPU a step of 3 drafts costs four plain ones); only
//! measured k are compared.
//! After that a step of the class now and then re-measures the best k's neighbour (one
//! draft more or less) whose cost it measured longest ago, so that a change in cost or in
//! acceptance is seen: 16 steps after the last re-measurement, twice as many after each
//! that left the best k as it was (up to 256), and 16 again once the best k changes; but
//! never before the class's steps since the last have taken 100 times what the
//! re-measurement is expected to lose (its steps at the best k's rate, and a catch-up where
//! it starts or stops drafting), so that re-measuring a k that loses much costs at most
//! about 1% of the time, however short the run (a k measured once, perhaps in a warm-up,
//! is re-measured on time). A re-measurement of drafting plans it for two steps, since the
//! first may catch up. A greedy request's output does not depend on the drafts it got.
//!
//! At trace level (`--log-level info,peregrine_actors::scheduler=trace`) each plan is
//! logged as `draft plan requests= class= k= why= rates=`.

use std::time::Duration;
use tracing::trace;

/// Steps of one batch size between two re-measurements, at first and once the best k
/// changes.
const EXPLORE_EVERY: u64 = 16;
/// The most steps between two re-measurements, which double while the best k holds.
const EXPLORE_EVERY_MAX: u64 = 256;
/// The most steps a choice to start or stop drafting is expected to hold, when weighing
/// what it saves against a catch-up.
pub const SWITCH_HORIZON_MAX: u64 = 64;
/// Weight of a new step in a cost's moving average.
const COST_WEIGHT: f64 = 0.1;
/// Weight of one step in the moving average of tokens per request: an average fed after
/// `s` steps without news takes `1 - (1 - w)^s` of the new step (at most a half), so an
/// estimate that only re-measurements feed still follows within a few of them.
const TOKENS_WEIGHT: f64 = 0.05;
/// The share of a class's decode time its re-measurements are expected to lose at most: a
/// re-measurement waits until the steps since the last have taken its expected loss over
/// this share.
const EXPLORE_BUDGET: f64 = 0.01;
/// A class's point and a k with no point within this factor of the batch size is
/// measured before it is compared.
const NEAR: f64 = 2.0;
/// How much more tokens per second drafting must be estimated to give than planning none
/// for the controller to start drafting: the estimates move by a few percent with the
/// text's acceptance and the machine, and drafting costs beside its own steps (catch-ups,
/// the head's work beside plain steps). On an H100 at batch 64, one draft estimated 0.1%
/// ahead of none was drafted, and the batch ran at 0.86x.
const START_MARGIN: f64 = 0.04;

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

/// One class's measured decode steps of one k: their mean size and wall time.
#[derive(Clone, Copy, Debug)]
struct Point {
    n: f64,
    seconds: f64,
    samples: u64,
    last_step: u64,
}

/// The decode-step cost of one k: a point per batch-size class.
#[derive(Clone, Debug, Default)]
struct Curve {
    points: Vec<Option<Point>>,
}

impl Curve {
    /// The estimated wall time of a step of `n` requests: linear between the points on
    /// either side of `n`, the nearest one's past the last; `None` when no point lies
    /// within a factor [`NEAR`] of `n`.
    fn at(&self, n: f64) -> Option<f64> {
        let below = self.points.iter().flatten().filter(|p| p.n <= n);
        let above = self.points.iter().flatten().filter(|p| p.n > n);
        let below = below.max_by(|a, b| a.n.total_cmp(&b.n));
        let above = above.min_by(|a, b| a.n.total_cmp(&b.n));
        let near = |p: &Point| (p.n / n).max(n / p.n) <= NEAR;
        if !below.iter().chain(above.iter()).any(|p| near(p)) {
            return None;
        }
        Some(match (below, above) {
            (Some(a), Some(b)) => a.seconds + (b.seconds - a.seconds) * (n - a.n) / (b.n - a.n),
            (Some(p), None) | (None, Some(p)) => p.seconds,
            (None, None) => unreachable!("a near point exists"),
        })
    }

    /// The point nearest `n`.
    fn nearest(&self, n: f64) -> Option<&Point> {
        let distance = |p: &&Point| (p.n / n).max(n / p.n);
        self.points
            .iter()
            .flatten()
            .min_by(|a, b| distance(a).total_cmp(&distance(b)))
    }

    /// When the point nearest `n` was last fed (0 if none).
    fn last_fed_near(&self, n: f64) -> u64 {
        self.nearest(n).map_or(0, |p| p.last_step)
    }

    /// Feeds a step of `n` requests that took `seconds` into `class`'s point.
    fn feed(&mut self, class: usize, n: f64, seconds: f64, step: u64) {
        let expected = self.at(n);
        if self.points.len() <= class {
            self.points.resize(class + 1, None);
        }
        let slot = &mut self.points[class];
        *slot = Some(match *slot {
            None => Point {
                n,
                seconds,
                samples: 1,
                last_step: step,
            },
            // The cheaper of a class's first two steps.
            Some(p) if p.samples == 1 => Point {
                n: (p.n + n) / 2.0,
                seconds: p.seconds.min(seconds),
                samples: 2,
                last_step: step,
            },
            Some(p) => {
                let seconds = expected.map_or(seconds, |e| seconds.clamp(0.8 * e, 1.25 * e));
                Point {
                    n: p.n + COST_WEIGHT * (n - p.n),
                    seconds: p.seconds + COST_WEIGHT * (seconds - p.seconds),
                    samples: p.samples + 1,
                    last_step: step,
                }
            }
        });
    }
}

/// What one decode batch-size class decided.
#[derive(Clone, Debug, Default)]
struct SizeState {
    /// Decisions made for this class.
    steps: u64,
    /// The step of the last re-measurement, and the steps until the next.
    explored_at: u64,
    explore_every: u64,
    /// The best k at the last decision.
    best: Option<usize>,
    /// A re-measured k planned again at the next step: the first step of a k after a
    /// pause may catch the drafter up, which teaches no cost (`DecodeStep::caught_up`).
    again: Option<usize>,
}

/// The adaptive draft-count controller.
#[derive(Clone, Debug)]
pub struct DraftControl {
    max_drafts: usize,
    adaptive: bool,
    /// Per batch-size class ([`size_class`]).
    sizes: Vec<SizeState>,
    /// Decode-step costs by k planned.
    costs: Vec<Curve>,
    /// Tokens a request emits per step by k planned.
    tokens: Vec<Option<Average>>,
    /// Seconds a step that caught the drafter up took beyond its k's cost.
    catch_up: Option<Average>,
    /// Whether the last step planned drafts.
    drafting: bool,
    /// Whether the last choice that measured nothing new ("best" or "holds") planned
    /// drafts: the state a measurement returns to unless what it measured is worth a
    /// switch, so that a re-measurement of drafting that finds a near tie does not leave
    /// the class drafting.
    chosen_drafting: bool,
    /// Steps recorded, the clock of `last_step`.
    clock: u64,
}

/// A plan's drafts per request, why (`fixed` where not adaptive), and the estimated
/// tokens per second of each k it compared.
struct Choice {
    k: usize,
    why: &'static str,
    rates: Vec<f64>,
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
    /// The proposal caught the drafter up ([`crate::messages::Drafts::caught_up`]): the
    /// step's time is its k's cost and a catch-up.
    pub caught_up: bool,
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
            costs: vec![Curve::default(); max_drafts + 1],
            tokens: vec![None; max_drafts + 1],
            catch_up: None,
            drafting: false,
            chosen_drafting: false,
            clock: 0,
        }
    }

    /// Takes new limits; what was measured for draft counts past a lower maximum goes.
    pub fn reconfigure(&mut self, max_drafts: usize, adaptive: bool) {
        self.tokens.resize(max_drafts + 1, None);
        self.costs.resize(max_drafts + 1, Curve::default());
        self.max_drafts = max_drafts;
        self.adaptive = adaptive;
    }

    /// Estimated tokens per second per request of a step of `n` with `k` planned, and its
    /// cost; an unmeasured k counts as the best.
    fn rate(&self, n: f64, k: usize) -> (f64, Option<f64>) {
        // A k whose tokens no step measured yet is taken to accept every draft.
        let tokens = self.tokens[k].map_or(1.0 + k as f64, |a| a.value);
        match self.costs[k].at(n) {
            Some(s) if s > 0.0 => (tokens / s, Some(s)),
            _ => (f64::INFINITY, None),
        }
    }

    /// Whether planning `to` in place of `from` at `n` saves more than a catch-up costs
    /// over `horizon` steps of `to`: the time `to`'s tokens would take at `from`'s rate,
    /// less `to`'s own. Starting to draft needs `to`'s rate [`START_MARGIN`] above
    /// `from`'s, and a catch-up only where the last step planned none (else the drafter
    /// has just caught up).
    fn worth_switching(&self, n: f64, from: usize, to: usize, horizon: u64) -> bool {
        let ((from_rate, from_cost), (to_rate, to_cost)) = (self.rate(n, from), self.rate(n, to));
        if from == 0 && to > 0 {
            if to_rate < from_rate * (1.0 + START_MARGIN) {
                return false;
            }
            if self.drafting {
                return true;
            }
        }
        let (Some(catch_up), Some(_), Some(to_cost)) = (self.catch_up, from_cost, to_cost) else {
            return true;
        };
        let to_tokens = to_rate * to_cost;
        let saved_per_step = to_tokens / from_rate - to_cost;
        saved_per_step * horizon as f64 > catch_up.value
    }

    /// The time re-measuring `k` at `n` is expected to lose against planning `best`: its
    /// steps (two when drafting, the first of which may catch up) at `best`'s rate, and
    /// a catch-up where it starts or stops drafting.
    fn re_measure_loss(&self, n: f64, best: usize, k: usize) -> f64 {
        let ((best_rate, _), (rate, Some(cost))) = (self.rate(n, best), self.rate(n, k)) else {
            return 0.0;
        };
        let steps = if k > 0 { 2.0 } else { 1.0 };
        let per_step = (cost - rate * cost / best_rate).max(0.0);
        let catch_up = self.catch_up.map_or(0.0, |a| a.value);
        let switches = (k > 0) != (best > 0);
        steps * per_step + if switches { catch_up } else { 0.0 }
    }

    /// The drafts to plan per request for a step that decodes `requests` requests.
    pub fn plan(&mut self, requests: usize) -> usize {
        let Choice { k, why, rates } = self.choose(requests);
        if why != "fixed" {
            let class = size_class(requests);
            trace!(requests, class, k, why, ?rates, "draft plan");
        }
        k
    }

    /// Whether the step after the one just planned, of `requests` decoding requests, would
    /// plan drafts as things stand (before this step's measurements come in): a greedy
    /// step ahead of it, which a step with drafts drops, is queued only where it would not.
    pub fn expects_drafts_next(&self, requests: usize) -> bool {
        if !self.adaptive {
            return self.max_drafts > 0;
        }
        // Planning moves the controller on (its step counts, a re-measurement's second
        // step): a copy plans.
        self.clone().choose(requests).k > 0
    }

    /// [`DraftControl::plan`]'s choice, and why.
    fn choose(&mut self, requests: usize) -> Choice {
        if !self.adaptive || requests == 0 {
            return Choice {
                k: self.max_drafts,
                why: "fixed",
                rates: Vec::new(),
            };
        }
        let class = size_class(requests);
        if self.sizes.len() <= class {
            self.sizes.resize(class + 1, SizeState::default());
        }
        let k_max = self.max_drafts;
        let n = requests as f64;
        self.sizes[class].steps += 1;
        if let Some(k) = self.sizes[class].again.take() {
            return Choice {
                k,
                why: "again",
                rates: Vec::new(),
            };
        }
        let rates: Vec<f64> = (0..=k_max).map(|k| self.rate(n, k).0).collect();
        let measured = |k: &usize| self.costs[*k].at(n).is_some();
        // Measure from none upwards while each k pays more than the one below it.
        let untried = (0..=k_max)
            .take_while(|&k| k < 2 || rates[k - 1] > rates[k - 2])
            .find(|k| !measured(k));
        let best = (0..=k_max)
            .filter(measured)
            .max_by(|&a, &b| rates[a].total_cmp(&rates[b]).then(b.cmp(&a)));
        let size = &mut self.sizes[class];
        if size.best != best || size.explore_every == 0 {
            size.explore_every = EXPLORE_EVERY;
            size.explored_at = size.steps;
        }
        size.best = best;
        let since = size.steps - size.explored_at;
        let horizon = size.explore_every.min(SWITCH_HORIZON_MAX);
        // The best k's neighbour measured longest ago, if re-measuring it is due and the
        // steps since the last re-measurement have earned what it is expected to lose.
        let neighbour = best
            .filter(|_| since >= size.explore_every)
            .and_then(|best| {
                let costs = &self.costs;
                let k = [best.checked_sub(1), Some(best + 1).filter(|&k| k <= k_max)]
                    .into_iter()
                    .flatten()
                    .min_by_key(|&k| costs[k].last_fed_near(n))?;
                let earned = self.rate(n, best).1.map_or(0.0, |s| s * since as f64);
                // A cost of one step may be a warm-up's: its second comes on time.
                let once = costs[k].nearest(n).is_none_or(|p| p.samples < 2);
                (once || self.re_measure_loss(n, best, k) <= EXPLORE_BUDGET * earned).then_some(k)
            });
        let (k, why) = match (untried, neighbour, best) {
            (Some(k), _, _) => (k, "untried"),
            (None, Some(k), _) => {
                let size = &mut self.sizes[class];
                size.explored_at = size.steps;
                size.explore_every = (2 * size.explore_every).min(EXPLORE_EVERY_MAX);
                size.again = (k > 0).then_some(k);
                (k, "re-measure")
            }
            (None, None, best) => {
                let best = best.unwrap_or(k_max);
                // Starting or stopping drafts, against the state chosen before any
                // measurement: weighed against a catch-up.
                let stay = match self.chosen_drafting {
                    false => 0,
                    true => (1..=k_max)
                        .filter(measured)
                        .max_by(|&a, &b| rates[a].total_cmp(&rates[b]).then(b.cmp(&a)))
                        .unwrap_or(best),
                };
                let chosen = if (best > 0) != self.chosen_drafting
                    && !self.worth_switching(n, stay, best, horizon)
                {
                    (stay, "holds")
                } else {
                    (best, "best")
                };
                self.chosen_drafting = chosen.0 > 0;
                chosen
            }
        };
        Choice { k, why, rates }
    }

    /// Feeds what a decode step planned with [`DraftControl::plan`] measured.
    pub fn record(&mut self, step: &DecodeStep) {
        if !self.adaptive || step.requests == 0 || step.planned > self.max_drafts {
            return;
        }
        self.clock += 1;
        self.drafting = step.planned > 0;
        let n = step.requests as f64;
        for k in 0..=step.planned {
            let extra: usize = step.accepted.iter().map(|&a| a.min(k)).sum();
            let sample = 1.0 + extra as f64 / n;
            // Past 64 quiet steps the weight is at its cap anyway.
            let quiet = self.tokens[k].map_or(1, |a| (self.clock - a.last_step).min(64));
            let weight = (1.0 - (1.0 - TOKENS_WEIGHT).powi(quiet as i32)).min(0.5);
            Average::feed(&mut self.tokens[k], sample, weight, self.clock);
        }
        let Some(elapsed) = step.elapsed.map(|e| e.as_secs_f64()) else {
            return;
        };
        let curve = &mut self.costs[step.planned];
        if step.caught_up {
            if let Some(expected) = curve.at(n) {
                let extra = (elapsed - expected).max(0.0);
                Average::feed(&mut self.catch_up, extra, COST_WEIGHT, self.clock);
            }
            return;
        }
        curve.feed(size_class(step.requests), n, elapsed, self.clock);
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
        /// up); the step says it caught up.
        catch_up: f64,
        last_k: usize,
        /// The first step of each k at each size class costs this many times more (a
        /// warm-up).
        first_spike: f64,
        seen: Vec<(usize, usize)>,
        /// The chance of a step taking `hiccup.1` times its cost (the machine busy with
        /// something else for a moment).
        hiccup: (f64, f64),
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
            self.run_sizes(control, std::iter::repeat_n(n, steps))
        }

        /// Runs one step of each batch size `sizes` gives; returns the tokens per second
        /// overall.
        fn run_sizes(
            &mut self,
            control: &mut DraftControl,
            sizes: impl IntoIterator<Item = usize>,
        ) -> f64 {
            let (mut tokens, mut seconds) = (0usize, 0.0);
            for n in sizes {
                let k = control.plan(n);
                let accepted: Vec<usize> = (0..n)
                    .map(|_| (0..k).take_while(|_| self.uniform() < self.accept).count())
                    .collect();
                // Timing noise of up to 5%.
                let mut cost = (self.fixed + self.per_row * (n * (1 + k)) as f64)
                    * (1.0 + 0.05 * self.uniform());
                if self.hiccup.0 > 0.0 && self.uniform() < self.hiccup.0 {
                    cost *= self.hiccup.1;
                }
                if !self.seen.contains(&(size_class(n), k)) {
                    self.seen.push((size_class(n), k));
                    cost *= self.first_spike;
                }
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
                    elapsed: Some(Duration::from_secs_f64(cost)),
                    caught_up,
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
            first_spike: 1.0,
            seen: Vec::new(),
            hiccup: (0.0, 1.0),
        }
    }

    /// The tokens per second of always planning `k`, by running the simulation with it.
    fn fixed_rate(fixed: f64, per_row: f64, accept: f64, n: usize, k: usize) -> f64 {
        let mut control = DraftControl::new(k, false);
        sim(fixed, per_row, accept, 7).run(&mut control, n, 2000)
    }

    #[test]
    fn the_drafts_a_step_will_plan_are_foreseen_without_changing_the_plan() {
        // Learning at batch 1 (drafting pays) and 64 (it does not), then each step foreseen
        // just before it is planned: the foresight is the plan, and planning is unchanged by
        // it (the same seed without foresight plans the same).
        let plans = |foresee: bool| {
            let mut control = DraftControl::new(3, true);
            let mut s = sim(1e-3, 0.1e-3, 0.7, 5);
            let mut planned = Vec::new();
            for n in [1, 64, 1, 64] {
                for _ in 0..150 {
                    let foreseen = foresee.then(|| control.expects_drafts_next(n));
                    let k = control.clone().plan(n);
                    if let Some(foreseen) = foreseen {
                        assert_eq!(foreseen, k > 0, "batch {n}");
                    }
                    s.run(&mut control, n, 1);
                    planned.push((n, k));
                }
            }
            planned
        };
        let planned = plans(true);
        assert_eq!(planned, plans(false));
        let drafting = |n| planned.iter().filter(|&&(m, k)| m == n && k > 0).count();
        assert!(drafting(1) > 250, "{} of 300 steps at batch 1", drafting(1));
        assert!(
            drafting(64) < 30,
            "{} of 300 steps at batch 64",
            drafting(64)
        );
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

    /// Runs 3,000 steps of 64 requests from each seed with `make`'s costs, then 1,000
    /// more: the first part must come within 2% of never drafting (`never` tokens per
    /// second), and the rest must draft in under 5% of its steps.
    fn stays_off_at_64(make: &dyn Fn() -> Sim, seeds: &[u64], never: f64) {
        for &seed in seeds {
            let mut control = DraftControl::new(3, true);
            let mut sim = Sim {
                state: seed,
                ..make()
            };
            let got = sim.run(&mut control, 64, 3000);
            let drafting = (0..1000)
                .filter(|_| {
                    sim.run(&mut control, 64, 1);
                    sim.last_k > 0
                })
                .count();
            assert!(
                drafting < 50,
                "seed {seed}: {drafting} of the next 1000 steps drafted"
            );
            assert!(
                got > 0.98 * never,
                "seed {seed}: {got:.1} vs never drafting {never:.1} tok/s"
            );
        }
    }

    #[test]
    fn a_near_tie_found_by_a_re_measurement_does_not_start_drafting() {
        // Batch 64 as on an H100 with the shipped head: a step of one draft costs 1.77
        // plain ones and yields 1.757 tokens a request, 0.7% fewer tokens a second than
        // none, within the estimates' noise; starting to draft catches the head up. A
        // re-measurement that finds the two about even goes back to none.
        let make = || Sim {
            catch_up: 6e-3,
            ..sim(0.3e-3, 15.6e-6, 0.757, 21)
        };
        let fixed: Vec<f64> = (0..=1)
            .map(|k| fixed_rate_over(&make, &[64; 4000], k))
            .collect();
        assert!(fixed[0] > fixed[1], "one draft loses a little: {fixed:.1?}");
        stays_off_at_64(&make, &[21, 22, 23], fixed[0]);
    }

    #[test]
    fn a_slow_first_plain_step_does_not_start_drafting_where_it_loses() {
        // Batch 64: none is 4% ahead of one draft, but the first step of each k at the
        // size costs 1.2 times what it will (on an H100 the first plain step of 64 took
        // 1.52 ms, later ones 1.28 to 1.37).
        let make = || Sim {
            catch_up: 6e-3,
            first_spike: 1.2,
            ..sim(0.3e-3, 15.6e-6, 0.70, 31)
        };
        let never = fixed_rate_over(&make, &[64; 4000], 0);
        stays_off_at_64(&make, &[31, 32, 33], never);
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

    /// The first `steps` plans at batch 5, each step costing 10 ms and accepting
    /// `accepted(k)` of its `k` drafts.
    fn first_plans(k_max: usize, steps: usize, accepted: fn(usize) -> usize) -> Vec<usize> {
        let mut control = DraftControl::new(k_max, true);
        (0..steps)
            .map(|_| {
                let k = control.plan(5);
                control.record(&DecodeStep {
                    requests: 5,
                    planned: k,
                    elapsed: Some(Duration::from_millis(10)),
                    caught_up: false,
                    accepted: &[accepted(k); 5],
                });
                k
            })
            .collect()
    }

    #[test]
    fn draft_counts_are_measured_upwards_while_each_pays_more() {
        // Every draft accepted at one cost: each k pays more than the one below it.
        assert_eq!(first_plans(3, 5, |k| k), vec![0, 1, 2, 3, 3]);
        // None accepted: one draft pays no more than none, so two and three are never
        // tried (at batch 64 on the CPU a step of three costs four plain ones).
        assert_eq!(first_plans(3, 5, |_| 0), vec![0, 1, 0, 0, 0]);
        // One accepted: two drafts pay no more than one.
        assert_eq!(first_plans(3, 5, |k| k.min(1)), vec![0, 1, 2, 1, 1]);
    }

    #[test]
    fn a_short_run_where_drafting_loses_pays_little_for_finding_it_out() {
        // 130 steps of batch 64 where the step is its rows (a CPU's): trying three drafts
        // first cost 8% of such a run; climbing from none stops after one draft.
        let best = fixed_rate(1e-3, 1e-3, 0.5, 64, 0);
        for seed in 0..4 {
            let mut control = DraftControl::new(3, true);
            let got = sim(1e-3, 1e-3, 0.5, 20 + seed).run(&mut control, 64, 130);
            assert!(
                got > 0.96 * best,
                "seed {seed}: {got:.1} vs never drafting {best:.1} tok/s"
            );
        }
    }

    #[test]
    fn a_short_run_where_one_draft_costs_two_steps_loses_under_two_percent() {
        // The CPU at batch 8: a step of one draft costs twice a plain one and the head's
        // catch-up after a pause more than another, and half the first drafts are
        // accepted. Re-measuring drafting 16, 48 and 112 steps in cost 7% of a 230-step
        // run; each re-measurement has to wait until the run has earned its expected loss.
        let best = fixed_rate(1e-3, 3e-3, 0.5, 8, 0);
        for seed in 0..4 {
            let mut control = DraftControl::new(3, true);
            let mut s = Sim {
                catch_up: 30e-3,
                ..sim(1e-3, 3e-3, 0.5, 30 + seed)
            };
            let got = s.run(&mut control, 8, 230);
            assert!(
                got > 0.98 * best,
                "seed {seed}: {got:.1} vs never drafting {best:.1} tok/s"
            );
        }
    }

    #[test]
    fn a_few_slow_plain_steps_do_not_start_drafting_where_it_loses() {
        // The CPU at batch 64: a step of one draft costs 1.85 plain ones for 1.6 tokens,
        // and one step in ten takes 30% longer. With each step a quarter of its cost's
        // moving average and one up to twice what was expected, a few slow plain steps
        // made a stale estimate of one draft look better: drafting started, and held for
        // its catch-up (0.980 of never drafting over these eight runs, one at 0.969).
        let make = |seed| Sim {
            catch_up: 80e-3,
            hiccup: (0.1, 1.3),
            ..sim(15e-3, 1.25e-3, 0.6, seed)
        };
        let ratios: Vec<f64> = (40..48)
            .map(|seed| {
                let never = make(seed).run(&mut DraftControl::new(0, false), 64, 400);
                make(seed).run(&mut DraftControl::new(3, true), 64, 400) / never
            })
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        assert!(
            mean > 0.982 && ratios.iter().all(|&r| r > 0.975),
            "against never drafting: {ratios:.3?}"
        );
    }

    #[test]
    fn steps_with_other_work_teach_acceptance_but_not_cost() {
        let mut control = DraftControl::new(1, true);
        assert_eq!(control.plan(1), 0);
        control.record(&DecodeStep {
            requests: 1,
            planned: 0,
            elapsed: Some(Duration::from_millis(10)),
            caught_up: false,
            accepted: &[],
        });
        assert_eq!(control.plan(1), 1);
        control.record(&DecodeStep {
            requests: 1,
            planned: 1,
            elapsed: None,
            caught_up: false,
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
        assert!(control.costs.iter().all(|c| c.points.is_empty()));
    }

    /// The tokens per second of always planning `k` over `sizes`, with `catch_up`.
    fn fixed_rate_over(sim: &dyn Fn() -> Sim, sizes: &[usize], k: usize) -> f64 {
        let mut control = DraftControl::new(k, false);
        sim().run_sizes(&mut control, sizes.iter().copied())
    }

    #[test]
    fn batches_either_side_of_a_class_boundary_see_one_cost() {
        // A served run at 64 concurrent requests: a ramp through 32-63 (class 5), where
        // drafting pays, then batches of 63 and 64 in turns (classes 5 and 6), where it
        // does not, each start of drafting costing a catch-up of four plain steps. Had
        // each class its own costs, 63 would keep drafting from what the ramp measured,
        // and each turn would pay the catch-up.
        let sizes: Vec<usize> = (32..64)
            .flat_map(|n| [n, n])
            .chain((0..1500).map(|i| 63 + i % 2))
            .collect();
        let make = || Sim {
            catch_up: 8e-3,
            ..sim(1e-3, 30e-6, 0.6, 11)
        };
        let best = (0..=3)
            .map(|k| fixed_rate_over(&make, &sizes, k))
            .fold(0.0, f64::max);
        let mut control = DraftControl::new(3, true);
        let got = make().run_sizes(&mut control, sizes.iter().copied());
        assert!(got > 0.95 * best, "{got:.1} vs best fixed {best:.1} tok/s");
    }

    #[test]
    fn a_run_that_drains_to_one_request_is_never_slower_than_a_fixed_choice() {
        // 64 requests finishing one by one, 20 steps apart: drafting stops paying above
        // some size and pays more and more below it. Near 64 one draft gains 2.5%, under
        // the margin drafting must clear to start, so that gain is given up.
        let sizes: Vec<usize> = (1..=64).rev().flat_map(|n| [n; 20]).collect();
        let make = || Sim {
            catch_up: 6e-3,
            ..sim(1e-3, 30e-6, 0.7, 12)
        };
        let fixed: Vec<f64> = (0..=3).map(|k| fixed_rate_over(&make, &sizes, k)).collect();
        let best = fixed.iter().copied().fold(0.0, f64::max);
        let mut control = DraftControl::new(3, true);
        let got = make().run_sizes(&mut control, sizes.iter().copied());
        assert!(
            got > (1.0 - START_MARGIN) * best && got > 1.05 * fixed[0],
            "{got:.1} vs fixed k = 0..3 {fixed:.1?} tok/s"
        );
    }

    #[test]
    fn a_warm_up_step_does_not_decide() {
        // The first step of each k at each size costs five times what it will.
        for (n, accept) in [(1, 0.7), (64, 0.7)] {
            let make = || Sim {
                first_spike: 5.0,
                ..sim(1e-3, 0.1e-3, accept, 13)
            };
            let best = (0..=3)
                .map(|k| fixed_rate(1e-3, 0.1e-3, accept, n, k))
                .fold(0.0, f64::max);
            let mut control = DraftControl::new(3, true);
            let got = make().run(&mut control, n, 400);
            assert!(
                got > 0.9 * best,
                "batch {n}: {got:.1} vs best {best:.1} tok/s"
            );
        }
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        let classes: Vec<usize> = [1, 2, 3, 4, 7, 8, 64, 65].map(size_class).to_vec();
        assert_eq!(classes, vec![0, 1, 1, 2, 2, 3, 6, 6]);
        assert_eq!(size_class_label(0), "1");
        assert_eq!(size_class_label(6), "64-127");
    }
}
