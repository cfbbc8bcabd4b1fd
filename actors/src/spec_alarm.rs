//! The whole-pool acceptance-collapse alarm: a broken drafter, whatever block ids its
//! sequences use. Per draft position it keeps the outcomes of the last `window` (300)
//! drafts that reached the position and the long-run counts before them. A position is
//! low when its window rate is below `collapse_ratio` (0.2) of its long-run rate and more
//! than `drop` (0.3) below it; when some position stays low for `sustain` (100)
//! consecutive verifications, the alarm is raised: the scheduler logs a warning naming the
//! positions, the window's numbers and the KV pool's largest block id in use, and sets
//! `peregrine:spec_decode_acceptance_alarm` to 1 until no position is low any more.
//! Long-run counts stop moving while the alarm is raised, so a lasting fault cannot
//! become the new normal.
//!
//! Acceptance rightly changes with the workload: mixed prompts after waves of one prompt
//! took a position from 48.8% to 17% with every output correct. The ratio keeps such a
//! change (0.35 of the long run) quiet, and the window of 300 keeps the noise of a window
//! at 17% (2.2 points) from reaching the 9.8% it would take; a collapse to nearly nothing
//! still fires. Acceptance that depends on where a sequence's KV lives, the shape of the
//! block-addressing incident, is the band alarm's (`spec_band_alarm`).

use std::collections::VecDeque;

/// When the alarm fires.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlarmSettings {
    /// Verifications per position in the sliding window.
    pub window: usize,
    /// Long-run verifications a position needs before it can alarm.
    pub min_history: u64,
    /// How far (absolute, 0..1) the window rate must fall below the long-run rate.
    pub drop: f64,
    /// The fraction of the long-run rate the window rate must fall below.
    pub collapse_ratio: f64,
    /// Consecutive low verifications before the alarm is raised.
    pub sustain: usize,
}

impl Default for AlarmSettings {
    fn default() -> Self {
        AlarmSettings {
            window: 300,
            min_history: 300,
            drop: 0.3,
            collapse_ratio: 0.2,
            sustain: 100,
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

/// What a verification did to the alarm.
#[derive(Clone, Debug, PartialEq)]
pub enum AlarmChange {
    Raised(Vec<LowPosition>),
    Cleared,
}

#[derive(Default)]
struct Position {
    window: VecDeque<bool>,
    window_accepted: usize,
    long_accepted: u64,
    long_proposed: u64,
}

impl Position {
    fn long_run(&self) -> f64 {
        self.long_accepted as f64 / self.long_proposed.max(1) as f64
    }

    fn low(&self, s: &AlarmSettings) -> bool {
        let rate = self.window_accepted as f64 / s.window as f64;
        self.long_proposed >= s.min_history
            && self.window.len() == s.window
            && rate < self.long_run() - s.drop
            && rate < self.long_run() * s.collapse_ratio
    }
}

/// The alarm's state.
pub struct AcceptanceAlarm {
    settings: AlarmSettings,
    positions: Vec<Position>,
    low_streak: usize,
    raised: bool,
}

impl AcceptanceAlarm {
    /// A quiet alarm.
    pub fn new(settings: AlarmSettings) -> AcceptanceAlarm {
        AcceptanceAlarm {
            settings,
            positions: Vec::new(),
            low_streak: 0,
            raised: false,
        }
    }

    /// Whether the alarm is raised.
    pub fn raised(&self) -> bool {
        self.raised
    }

    /// One verification: `drafts` proposed, the first `accepted` accepted. Returns the
    /// change of state, if any.
    pub fn record(&mut self, drafts: usize, accepted: usize) -> Option<AlarmChange> {
        let s = self.settings;
        if self.positions.len() < drafts {
            self.positions.resize_with(drafts, Position::default);
        }
        for (i, p) in self.positions.iter_mut().enumerate().take(drafts) {
            let ok = i < accepted;
            p.window.push_back(ok);
            p.window_accepted += usize::from(ok);
            if p.window.len() > s.window {
                let old = p.window.pop_front().unwrap_or(false);
                p.window_accepted -= usize::from(old);
                if !self.raised {
                    p.long_proposed += 1;
                    p.long_accepted += u64::from(old);
                }
            }
        }
        let low: Vec<LowPosition> = self
            .positions
            .iter()
            .enumerate()
            .filter(|(_, p)| p.low(&s))
            .map(|(position, p)| LowPosition {
                position,
                window_accepted: p.window_accepted,
                window_len: p.window.len(),
                long_run: p.long_run(),
            })
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
            .filter_map(|i| alarm.record(3, accepted(i)))
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
