//! The whole-pool acceptance-collapse alarm: a broken drafter, whatever block ids its
//! sequences use. It counts in steps (verification forwards), since the requests of one
//! step can be one sample many times over: waves of one prompt at temperature 0 run in
//! step, and their 64 requests accept or reject the same draft together, so that a
//! stretch of text the head drafts badly gave 0/300 at a position in a window of 300
//! verifications, five steps, without any fault. Per draft position it keeps the
//! outcomes of the last steps, at least `window_steps` (64) of them and at least
//! `window` (300) drafts at the position, and the long-run counts of the steps before
//! them. A position is low when its window rate is below `collapse_ratio` (0.2) of its
//! long-run rate and more than `drop` (0.3) below it; when some position stays low for
//! `sustain` (50) consecutive steps, the alarm is raised: the scheduler logs a warning
//! naming the positions, the window's numbers and the KV pool's largest block id in use,
//! and sets `peregrine:spec_decode_acceptance_alarm` to 1 until no position is low any
//! more. Long-run counts stop moving while the alarm is raised, so a lasting fault cannot
//! become the new normal.
//!
//! Acceptance rightly changes with the workload: mixed prompts after waves of one prompt
//! took a position from 48.8% to 17% with every output correct. The ratio keeps such a
//! change (0.35 of the long run) quiet, and a window of 300 drafts keeps the noise of a
//! window at 17% (2.2 points) from reaching the 9.8% it would take; a collapse to nearly
//! nothing still fires. Acceptance that depends on where a sequence's KV lives, the shape
//! of the block-addressing incident, is the band alarm's (`band_alarm`).

use std::collections::VecDeque;

/// When the alarm fires.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlarmSettings {
    /// Drafts per position the sliding window holds at least.
    pub window: usize,
    /// Steps the sliding window holds at least.
    pub window_steps: usize,
    /// Long-run drafts a position needs before it can alarm.
    pub min_history: u64,
    /// How far (absolute, 0..1) the window rate must fall below the long-run rate.
    pub drop: f64,
    /// The fraction of the long-run rate the window rate must fall below.
    pub collapse_ratio: f64,
    /// Consecutive low steps before the alarm is raised.
    pub sustain: usize,
}

impl Default for AlarmSettings {
    fn default() -> Self {
        AlarmSettings {
            window: 300,
            window_steps: 64,
            min_history: 300,
            drop: 0.3,
            collapse_ratio: 0.2,
            sustain: 50,
        }
    }
}

/// One low position when the alarm changes state.
#[derive(Clone, Debug, PartialEq)]
pub struct LowPosition {
    pub position: usize,
    /// Accepted / proposed in the window.
    pub window_accepted: usize,
    pub window_len: usize,
    /// The long-run acceptance rate.
    pub long_run: f64,
}

/// What a step did to the alarm.
#[derive(Clone, Debug, PartialEq)]
pub enum AlarmChange {
    Raised(Vec<LowPosition>),
    Cleared,
}

/// Per position: (proposed, accepted).
type Counts = Vec<(u64, u64)>;

/// Adds `b` to `a`, position by position (`add` false: takes it away).
fn shift(a: &mut Counts, b: &Counts, add: bool) {
    if a.len() < b.len() {
        a.resize(b.len(), (0, 0));
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = if add {
            (x.0 + y.0, x.1 + y.1)
        } else {
            (x.0 - y.0, x.1 - y.1)
        };
    }
}

/// The alarm's state.
pub struct AcceptanceAlarm {
    settings: AlarmSettings,
    /// The step being recorded.
    step: Counts,
    /// The window's steps, oldest first, and their sums.
    steps: VecDeque<Counts>,
    window: Counts,
    long_run: Counts,
    low_streak: usize,
    raised: bool,
}

impl AcceptanceAlarm {
    /// A quiet alarm.
    pub fn new(settings: AlarmSettings) -> AcceptanceAlarm {
        AcceptanceAlarm {
            settings,
            step: Vec::new(),
            steps: VecDeque::new(),
            window: Vec::new(),
            long_run: Vec::new(),
            low_streak: 0,
            raised: false,
        }
    }

    /// Whether the alarm is raised.
    pub fn raised(&self) -> bool {
        self.raised
    }

    /// One verification of the step being recorded: `drafts` proposed, the first
    /// `accepted` accepted.
    pub fn record(&mut self, drafts: usize, accepted: usize) {
        if self.step.len() < drafts {
            self.step.resize(drafts, (0, 0));
        }
        for (i, p) in self.step.iter_mut().enumerate().take(drafts) {
            *p = (p.0 + 1, p.1 + u64::from(i < accepted));
        }
    }

    /// Ends the step whose verifications [`AcceptanceAlarm::record`] took; returns the
    /// change of state, if any. A step that verified nothing changes nothing.
    pub fn end_step(&mut self) -> Option<AlarmChange> {
        let step = std::mem::take(&mut self.step);
        if step.is_empty() {
            return None;
        }
        let s = self.settings;
        shift(&mut self.window, &step, true);
        self.steps.push_back(step);
        while self.steps.len() > s.window_steps {
            let oldest = &self.steps[0];
            let left = self.window.first().map_or(0, |w| w.0) - oldest.first().map_or(0, |o| o.0);
            if left < s.window as u64 {
                break;
            }
            let oldest = self.steps.pop_front().unwrap_or_default();
            shift(&mut self.window, &oldest, false);
            if !self.raised {
                shift(&mut self.long_run, &oldest, true);
            }
        }
        let low: Vec<LowPosition> = (0..self.window.len())
            .filter_map(|position| self.low(position))
            .collect();
        self.low_streak = if low.is_empty() {
            0
        } else {
            self.low_streak + 1
        };
        if !self.raised && self.low_streak >= s.sustain {
            self.raised = true;
            return Some(AlarmChange::Raised(low));
        }
        if self.raised && low.is_empty() {
            self.raised = false;
            return Some(AlarmChange::Cleared);
        }
        None
    }

    /// The position's numbers if it is low.
    fn low(&self, position: usize) -> Option<LowPosition> {
        let s = &self.settings;
        let (n, a) = self.window[position];
        let (long_n, long_a) = self.long_run.get(position).copied().unwrap_or((0, 0));
        let long_run = long_a as f64 / long_n.max(1) as f64;
        let rate = a as f64 / n.max(1) as f64;
        let low = long_n >= s.min_history
            && n >= s.window as u64
            && rate < long_run - s.drop
            && rate < long_run * s.collapse_ratio;
        low.then_some(LowPosition {
            position,
            window_accepted: a as usize,
            window_len: n as usize,
            long_run,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn feed(
        alarm: &mut AcceptanceAlarm,
        n: usize,
        mut accepted: impl FnMut(usize) -> usize,
    ) -> Vec<AlarmChange> {
        (0..n)
            .filter_map(|i| {
                alarm.record(3, accepted(i));
                alarm.end_step()
            })
            .collect()
    }

    /// Drafts accepted up to the first rejection, each with probability `rate`.
    fn chain(rng: &mut ChaCha8Rng, rate: f64) -> usize {
        (0..3).take_while(|_| rng.random_bool(rate)).count()
    }

    #[test]
    fn a_collapse_raises_it_and_recovery_clears_it() {
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        // Long run: positions accepted 3, 2, 1 times in 4.
        assert!(feed(&mut alarm, 1000, |i| 3 - (i % 4).min(3)).is_empty());
        let changes = feed(&mut alarm, 600, |_| 0);
        let Some(AlarmChange::Raised(low)) = changes.first() else {
            panic!("no alarm: {changes:?}");
        };
        assert_eq!(changes.len(), 1);
        assert!(
            low.iter().any(|l| l.position == 0 && l.long_run > 0.7),
            "{low:?}"
        );
        assert!(alarm.raised());
        let changes = feed(&mut alarm, 400, |i| 3 - (i % 4).min(3));
        assert_eq!(changes, vec![AlarmChange::Cleared]);
        assert!(!alarm.raised());
    }

    #[test]
    fn a_change_of_workload_stays_quiet_and_a_collapse_to_nearly_nothing_fires() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        // Waves of one prompt: position 0 accepts 48.8%.
        assert!(feed(&mut alarm, 3000, |_| chain(&mut rng, 0.488)).is_empty());
        // Mixed prompts: 17%, for a long time.
        assert!(feed(&mut alarm, 20_000, |_| chain(&mut rng, 0.17)).is_empty());
        assert!(!alarm.raised());
        // The same waves, then a broken head: 2%.
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        assert!(feed(&mut alarm, 3000, |_| chain(&mut rng, 0.488)).is_empty());
        let changes = feed(&mut alarm, 1000, |_| chain(&mut rng, 0.02));
        let [AlarmChange::Raised(low)] = &changes[..] else {
            panic!("{changes:?}");
        };
        assert_eq!(low[0].position, 0);
        assert!(low[0].window_accepted < 20, "{low:?}");
    }

    /// Steps of 64 requests of one prompt in step: each step's requests accept the
    /// same number of drafts, which `accepted(step)` gives.
    fn lockstep(
        alarm: &mut AcceptanceAlarm,
        steps: usize,
        mut accepted: impl FnMut(usize) -> usize,
    ) -> Vec<AlarmChange> {
        (0..steps)
            .filter_map(|i| {
                let a = accepted(i);
                for _ in 0..64 {
                    alarm.record(3, a);
                }
                alarm.end_step()
            })
            .collect()
    }

    #[test]
    fn waves_of_one_prompt_in_step_stay_quiet_and_a_broken_head_fires() {
        // Waves of 120 steps over one text: 12 steps drafted badly in every 36.
        let mut text = ChaCha8Rng::seed_from_u64(7);
        let rates: Vec<f64> = (0..120)
            .map(|step| if (step / 12) % 3 == 0 { 0.03 } else { 0.8 })
            .collect();
        let wave: Vec<usize> = rates.iter().map(|&r| chain(&mut text, r)).collect();
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        assert!(lockstep(&mut alarm, 25 * 120, |i| wave[i % 120]).is_empty());
        let changes = lockstep(&mut alarm, 200, |_| 0);
        assert!(
            matches!(&changes[..], [AlarmChange::Raised(_)]),
            "{changes:?}"
        );
    }

    #[test]
    fn noise_and_a_short_dip_stay_quiet() {
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        // Pseudo-random acceptance around 60%, then a dip shorter than `sustain`.
        let noisy = |i: usize| ((i * 7919 + 13) % 10 < 6) as usize * 3;
        assert!(feed(&mut alarm, 5000, noisy).is_empty());
        assert!(feed(&mut alarm, 30, |_| 0).is_empty());
        assert!(feed(&mut alarm, 2000, noisy).is_empty());
        assert!(!alarm.raised());
    }
}
