//! The acceptance-collapse alarm. Per draft position it keeps the outcomes of the last
//! `window` drafts that reached the position and the long-run counts before them. When a
//! position's window rate stays more than `drop` below its long-run rate for `sustain`
//! consecutive verifications, the alarm is raised: the scheduler logs a warning naming
//! the positions, the window's numbers and the KV pool's largest block id in use (the
//! number that crossed 65,535 when a kernel started reading the wrong blocks) and sets
//! `peregrine:spec_decode_acceptance_alarm` to 1 until no position is low any more.
//! Long-run counts stop moving while the alarm is raised, so a lasting fault cannot
//! become the new normal.

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
    /// Consecutive low verifications before the alarm is raised.
    pub sustain: usize,
}

impl Default for AlarmSettings {
    fn default() -> Self {
        AlarmSettings {
            window: 100,
            min_history: 300,
            drop: 0.3,
            sustain: 25,
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
        self.long_proposed >= s.min_history
            && self.window.len() == s.window
            && (self.window_accepted as f64 / s.window as f64) < self.long_run() - s.drop
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

    fn feed(
        alarm: &mut AcceptanceAlarm,
        n: usize,
        accepted: impl Fn(usize) -> usize,
    ) -> Vec<AlarmChange> {
        (0..n)
            .filter_map(|i| alarm.record(3, accepted(i)))
            .collect()
    }

    #[test]
    fn a_collapse_raises_it_and_recovery_clears_it() {
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        // Long run: positions accepted 3, 2, 1 times in 4.
        assert!(feed(&mut alarm, 1000, |i| 3 - (i % 4).min(3)).is_empty());
        let changes = feed(&mut alarm, 200, |_| 0);
        let Some(AlarmChange::Raised(low)) = changes.first() else {
            panic!("no alarm: {changes:?}");
        };
        assert_eq!(changes.len(), 1);
        assert!(
            low.iter().any(|l| l.position == 0 && l.long_run > 0.7),
            "{low:?}"
        );
        assert!(alarm.raised());
        let changes = feed(&mut alarm, 200, |i| 3 - (i % 4).min(3));
        assert_eq!(changes, vec![AlarmChange::Cleared]);
        assert!(!alarm.raised());
    }

    #[test]
    fn noise_and_a_short_dip_stay_quiet() {
        let mut alarm = AcceptanceAlarm::new(AlarmSettings::default());
        // Pseudo-random acceptance around 60%, then a dip shorter than `sustain`.
        let noisy = |i: usize| ((i * 7919 + 13) % 10 < 6) as usize * 3;
        assert!(feed(&mut alarm, 5000, noisy).is_empty());
        assert!(feed(&mut alarm, 10, |_| 0).is_empty());
        assert!(feed(&mut alarm, 2000, noisy).is_empty());
        assert!(!alarm.raised());
    }
}
