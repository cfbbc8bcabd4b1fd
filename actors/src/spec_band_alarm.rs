//! The band alarm: acceptance that depends on where a sequence's draft KV lives. The
//! incident it is built for: an EAGLE-3 draft layer past 2 GiB whose acceptance fell from
//! 80% to 25% once block ids passed 65,535, because a kernel computed wrong addresses for
//! the high blocks. A change of workload moves the acceptance of every band alike; a
//! fault of addressing moves only the bands past a limit.
//!
//! The window is the last `window` (4,000) verifications of every band together, each
//! placed in the band ([`Bands`]) of its sequence's largest block id. After each
//! verification, for each draft position p and each band boundary B, the drafts at p of
//! the verifications placed at or past B (side U) are compared with those placed before B
//! (side L), rates being accepted over proposed at p. The test is a one-sided
//! two-proportion z-test, `z = (r_U - r_L) / SE`, with SE the pooled binomial one,
//! `sqrt(r (1 - r) (1/n_U + 1/n_L))` (r the pooled rate, n the drafts), widened to the
//! request-clustered one, `sqrt(V_U + V_L)`, where that is larger; V is the sandwich
//! variance of a side's ratio over its requests, `k/(k-1) * sum_i (a_i - r n_i)^2 / n^2`
//! for k requests with a_i of n_i drafts accepted. The clustered error is there because
//! the drafts of one request are not independent (its prompt sets its acceptance): with
//! the binomial error alone, a few odd requests in one band, or a change of workload that
//! reached one band's requests first, would look significant.
//!
//! A comparison is low when each side has at least `min_proposed` (30) drafts at p from
//! at least `min_requests` (8) requests, `z < z_below` (-4: p < 3.2e-5 one-sided, so
//! that the few dozen comparisons of each check do not raise it by chance) and U's rate is
//! at least `min_gap` (0.2) below L's (with thousands of drafts, small differences between
//! bands, such as longer sequences reaching higher block ids, are significant without
//! being a fault; the incident's gap was 0.55). The alarm is raised when some comparison
//! is low at `sustain` (1,000) consecutive checks, and cleared when the comparisons that
//! raised it have their data again and none is low for as many checks. Only upper sides
//! are suspects, the shape of an address that goes wrong past a limit; the lowest band
//! never is.

use crate::messages::RequestId;
use crate::spec_bands::Bands;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write;

/// When the band alarm fires.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BandAlarmSettings {
    /// Verifications of every band together in the sliding window.
    pub window: usize,
    /// Drafts each side of a comparison needs at the position.
    pub min_proposed: u64,
    /// Requests each side of a comparison needs at the position.
    pub min_requests: u64,
    /// The z statistic below which a side may be low.
    pub z_below: f64,
    /// How far (absolute, 0..1) the upper side's rate must be below the lower side's.
    pub min_gap: f64,
    /// Consecutive checks (one per verification) that raise the alarm, and clear it.
    pub sustain: usize,
}

impl Default for BandAlarmSettings {
    fn default() -> Self {
        BandAlarmSettings {
            window: 4000,
            min_proposed: 30,
            min_requests: 8,
            z_below: -4.0,
            min_gap: 0.2,
            sustain: 1000,
        }
    }
}

/// The window's drafts at one position on one side of a comparison (or in one band), with
/// the sums over its requests that the clustered variance needs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Side {
    /// Drafts accepted.
    pub accepted: u64,
    /// Drafts proposed.
    pub proposed: u64,
    /// Requests with drafts at the position.
    pub requests: u64,
    /// Sums over requests of n_i^2, a_i^2 and a_i n_i.
    nn: u64,
    aa: u64,
    an: u64,
}

impl Side {
    /// Adds one request's `(proposed, accepted)` (`add`), or takes it away.
    fn shift(&mut self, (n, a): (u64, u64), add: bool) {
        let parts = [
            (&mut self.proposed, n),
            (&mut self.accepted, a),
            (&mut self.requests, u64::from(n > 0)),
            (&mut self.nn, n * n),
            (&mut self.aa, a * a),
            (&mut self.an, a * n),
        ];
        for (sum, v) in parts {
            if add {
                *sum += v;
            } else {
                *sum -= v;
            }
        }
    }

    fn plus(mut self, other: &Side) -> Side {
        self.accepted += other.accepted;
        self.proposed += other.proposed;
        self.requests += other.requests;
        self.nn += other.nn;
        self.aa += other.aa;
        self.an += other.an;
        self
    }

    /// Accepted over proposed.
    pub fn rate(&self) -> f64 {
        self.accepted as f64 / self.proposed.max(1) as f64
    }

    /// The request-clustered (sandwich) variance of the rate.
    fn clustered_variance(&self) -> f64 {
        if self.requests < 2 {
            return 0.0;
        }
        let (r, n) = (self.rate(), self.proposed as f64);
        let squares = self.aa as f64 - 2.0 * r * self.an as f64 + r * r * self.nn as f64;
        let k = self.requests as f64;
        k / (k - 1.0) * squares.max(0.0) / (n * n)
    }
}

/// The z statistic of `upper`'s rate against `lower`'s, both with drafts (0 when
/// neither varies).
fn z_statistic(upper: &Side, lower: &Side) -> f64 {
    let (n1, n2) = (upper.proposed as f64, lower.proposed as f64);
    let pooled = (upper.accepted + lower.accepted) as f64 / (n1 + n2);
    let binomial = pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2);
    let clustered = upper.clustered_variance() + lower.clustered_variance();
    let se = binomial.max(clustered).sqrt();
    if se > 0.0 {
        (upper.rate() - lower.rate()) / se
    } else {
        0.0
    }
}

/// A position where the bands at and past a boundary accept less than those before it.
#[derive(Clone, Debug, PartialEq)]
pub struct BandLow {
    /// The draft position (0 is the first draft).
    pub position: usize,
    /// The first band of the low side: bands `from..` against bands `..from`.
    pub from: usize,
    /// The drafts of bands `from..`.
    pub low: Side,
    /// The drafts of bands `..from`.
    pub rest: Side,
    /// The z statistic of `low` against `rest`.
    pub z: f64,
    /// Each band's (accepted, proposed) at the position in the window.
    pub per_band: Vec<(u64, u64)>,
}

/// What a verification did to the band alarm.
#[derive(Clone, Debug, PartialEq)]
pub enum BandAlarmChange {
    /// Raised, with the lowest comparison of each low position.
    Raised(Vec<BandLow>),
    /// Cleared: the comparisons that raised it are fine again.
    Cleared,
}

/// What one comparison found.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    /// Too few drafts or requests on a side.
    Thin,
    Fine,
    Low,
}

/// A comparison: (draft position, first band of the upper side).
type Key = (usize, usize);

/// One verification in the window.
struct Entry {
    band: usize,
    request: RequestId,
    drafts: usize,
    accepted: usize,
}

/// One request's drafts in one band in the window.
#[derive(Default)]
struct Cluster {
    verifications: usize,
    /// Per position: (proposed, accepted).
    per_position: Vec<(u64, u64)>,
}

/// The band alarm's state.
pub struct BandAlarm {
    settings: BandAlarmSettings,
    bands: usize,
    entries: VecDeque<Entry>,
    /// Per band: each request's drafts in the window.
    clusters: Vec<HashMap<RequestId, Cluster>>,
    /// Per band, per position: the window's sums.
    sums: Vec<Vec<Side>>,
    low_streak: usize,
    quiet_streak: usize,
    /// While raised: the (position, from) comparisons that were low.
    raised: Option<HashSet<Key>>,
}

impl BandAlarm {
    /// A quiet alarm over `bands` bands (with one band there is nothing to compare).
    pub fn new(settings: BandAlarmSettings, bands: usize) -> BandAlarm {
        BandAlarm {
            settings,
            bands,
            entries: VecDeque::new(),
            clusters: (0..bands).map(|_| HashMap::new()).collect(),
            sums: vec![Vec::new(); bands],
            low_streak: 0,
            quiet_streak: 0,
            raised: None,
        }
    }

    /// Whether the alarm is raised.
    pub fn raised(&self) -> bool {
        self.raised.is_some()
    }

    /// One verification of `request`, placed in `band`: `drafts` proposed, the first
    /// `accepted` accepted. Returns the change of state, if any.
    pub fn record(
        &mut self,
        band: usize,
        request: RequestId,
        drafts: usize,
        accepted: usize,
    ) -> Option<BandAlarmChange> {
        if self.bands < 2 {
            return None;
        }
        let entry = Entry {
            band,
            request,
            drafts,
            accepted,
        };
        self.apply(&entry, true);
        self.entries.push_back(entry);
        if self.entries.len() > self.settings.window {
            if let Some(old) = self.entries.pop_front() {
                self.apply(&old, false);
            }
        }
        self.check()
    }

    /// Adds `e` to the window's sums, or takes it away.
    fn apply(&mut self, e: &Entry, add: bool) {
        if self.sums[e.band].len() < e.drafts {
            for sums in &mut self.sums {
                sums.resize(e.drafts, Side::default());
            }
        }
        let clusters = &mut self.clusters[e.band];
        let cluster = clusters.entry(e.request).or_default();
        if cluster.per_position.len() < e.drafts {
            cluster.per_position.resize(e.drafts, (0, 0));
        }
        for (i, slot) in cluster.per_position.iter_mut().enumerate().take(e.drafts) {
            let ok = u64::from(i < e.accepted);
            let sums = &mut self.sums[e.band][i];
            sums.shift(*slot, false);
            *slot = if add {
                (slot.0 + 1, slot.1 + ok)
            } else {
                (slot.0 - 1, slot.1 - ok)
            };
            sums.shift(*slot, true);
        }
        if add {
            cluster.verifications += 1;
        } else {
            cluster.verifications -= 1;
            if cluster.verifications == 0 {
                clusters.remove(&e.request);
            }
        }
    }

    /// Every comparison now, by (position, from), and the low ones' findings.
    fn comparisons(&self) -> (Vec<(Key, Verdict)>, Vec<BandLow>) {
        let s = &self.settings;
        let (mut verdicts, mut lows) = (Vec::new(), Vec::new());
        for position in 0..self.sums[0].len() {
            let per_band: Vec<Side> = self.sums.iter().map(|b| b[position]).collect();
            for from in 1..self.bands {
                let low = per_band[from..].iter().fold(Side::default(), Side::plus);
                let rest = per_band[..from].iter().fold(Side::default(), Side::plus);
                let thin = [low, rest]
                    .iter()
                    .any(|x| x.proposed < s.min_proposed || x.requests < s.min_requests);
                if thin {
                    verdicts.push(((position, from), Verdict::Thin));
                    continue;
                }
                let z = z_statistic(&low, &rest);
                let verdict = if z < s.z_below && rest.rate() - low.rate() >= s.min_gap {
                    Verdict::Low
                } else {
                    Verdict::Fine
                };
                verdicts.push(((position, from), verdict));
                if verdict == Verdict::Low {
                    lows.push(BandLow {
                        position,
                        from,
                        low,
                        rest,
                        z,
                        per_band: per_band.iter().map(|b| (b.accepted, b.proposed)).collect(),
                    });
                }
            }
        }
        (verdicts, lows)
    }

    fn check(&mut self) -> Option<BandAlarmChange> {
        let (verdicts, lows) = self.comparisons();
        let sustain = self.settings.sustain;
        match &mut self.raised {
            None => {
                self.low_streak = if lows.is_empty() {
                    0
                } else {
                    self.low_streak + 1
                };
                if self.low_streak < sustain {
                    return None;
                }
                self.low_streak = 0;
                self.raised = Some(lows.iter().map(|l| (l.position, l.from)).collect());
                // The lowest comparison of each position.
                let mut worst: Vec<BandLow> = Vec::new();
                for finding in lows {
                    match worst.iter_mut().find(|w| w.position == finding.position) {
                        Some(w) if finding.z < w.z => *w = finding,
                        Some(_) => {}
                        None => worst.push(finding),
                    }
                }
                Some(BandAlarmChange::Raised(worst))
            }
            Some(keys) => {
                keys.extend(lows.iter().map(|l| (l.position, l.from)));
                let recovered = lows.is_empty()
                    && keys
                        .iter()
                        .all(|key| verdicts.contains(&(*key, Verdict::Fine)));
                self.quiet_streak = if recovered { self.quiet_streak + 1 } else { 0 };
                if self.quiet_streak < sustain {
                    return None;
                }
                self.quiet_streak = 0;
                self.raised = None;
                Some(BandAlarmChange::Cleared)
            }
        }
    }
}

/// The warning logged when the band alarm is raised: per low position, the low bands with
/// their block ids and byte offsets, the window's accepted / proposed on both sides and in
/// every band, and the z statistic; then the largest KV block id in use.
pub fn band_alarm_message(lows: &[BandLow], bands: &Bands, largest: Option<u32>) -> String {
    let mut text = String::from("spec: draft acceptance depends on where the draft KV lives:");
    for l in lows {
        let _ = write!(
            text,
            " position {}: {} accepted {}/{} ({:.1}%, {} requests) vs {}/{} ({:.1}%, {} \
             requests) below block {}, z {:.1}, by band",
            l.position,
            bands.describe(l.from..bands.count()),
            l.low.accepted,
            l.low.proposed,
            100.0 * l.low.rate(),
            l.low.requests,
            l.rest.accepted,
            l.rest.proposed,
            100.0 * l.rest.rate(),
            l.rest.requests,
            bands.start(l.from),
            l.z
        );
        for (band, (accepted, proposed)) in l.per_band.iter().enumerate() {
            let _ = write!(text, " {} {accepted}/{proposed}", bands.name(band));
        }
        text.push(';');
    }
    let block = largest.map_or("none".to_string(), |b| b.to_string());
    let _ = write!(text, " largest KV block id in use {block}");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A pool past block 65,535 whose draft layer takes 32 KiB a block: two bands,
    /// `blocks 0-65535` and `blocks 65536-69999` (2 GiB on).
    fn two_bands() -> Bands {
        Bands::new(70_000, Some(32 << 10))
    }

    /// One running request: where its KV lives, its per-draft acceptance, verifications
    /// left.
    struct Running {
        id: RequestId,
        block: u32,
        rate: f64,
        left: usize,
    }

    /// Requests run 16 at a time, interleaved at random, each for 20 to 80 verifications
    /// of 3 drafts (accepted up to the first rejection, each with its request's rate);
    /// `start(rng, n)` gives the n-th request's largest block id and rate.
    struct Traffic {
        rng: ChaCha8Rng,
        running: Vec<Running>,
        started: u64,
    }

    impl Traffic {
        fn new(seed: u64) -> Traffic {
            Traffic {
                rng: ChaCha8Rng::seed_from_u64(seed),
                running: Vec::new(),
                started: 0,
            }
        }

        fn run(
            &mut self,
            alarm: &mut BandAlarm,
            bands: &Bands,
            verifications: usize,
            start: &mut impl FnMut(&mut ChaCha8Rng, u64) -> (u32, f64),
        ) -> Vec<BandAlarmChange> {
            let mut changes = Vec::new();
            for _ in 0..verifications {
                while self.running.len() < 16 {
                    let (block, rate) = start(&mut self.rng, self.started);
                    let left = self.rng.random_range(20..=80);
                    self.running.push(Running {
                        id: RequestId(self.started),
                        block,
                        rate,
                        left,
                    });
                    self.started += 1;
                }
                let i = self.rng.random_range(0..self.running.len());
                let r = &mut self.running[i];
                let accepted = (0..3).take_while(|_| self.rng.random_bool(r.rate)).count();
                changes.extend(alarm.record(bands.of(r.block), r.id, 3, accepted));
                r.left -= 1;
                if r.left == 0 {
                    self.running.swap_remove(i);
                }
            }
            changes
        }
    }

    /// A largest block id: past 65,535 with probability `high`.
    fn place(rng: &mut ChaCha8Rng, high: f64) -> u32 {
        if rng.random_bool(high) {
            rng.random_range(65_536..70_000)
        } else {
            rng.random_range(0..65_536)
        }
    }

    fn alarm() -> BandAlarm {
        BandAlarm::new(BandAlarmSettings::default(), 2)
    }

    #[test]
    fn a_change_of_workload_in_every_band_stays_quiet() {
        let bands = two_bands();
        let mut alarm = alarm();
        // A seed under which the binomial error alone raises it.
        let mut traffic = Traffic::new(102);
        let mut before = |rng: &mut ChaCha8Rng, _| (place(rng, 0.3), 0.8);
        assert!(traffic
            .run(&mut alarm, &bands, 20_000, &mut before)
            .is_empty());
        // The same requests' prompts change: every new request accepts 20%.
        let mut after = |rng: &mut ChaCha8Rng, _| (place(rng, 0.3), 0.2);
        assert!(traffic
            .run(&mut alarm, &bands, 20_000, &mut after)
            .is_empty());
        // And a mix of both, request by request.
        let mut mixed = |rng: &mut ChaCha8Rng, _| {
            let rate = if rng.random_bool(0.5) { 0.9 } else { 0.15 };
            (place(rng, 0.3), rate)
        };
        assert!(traffic
            .run(&mut alarm, &bands, 40_000, &mut mixed)
            .is_empty());
        assert!(!alarm.raised());
    }

    #[test]
    fn blocks_past_65535_accepting_less_raise_it_and_recovery_clears_it() {
        let bands = two_bands();
        let mut alarm = alarm();
        let mut traffic = Traffic::new(2);
        let mut healthy = |rng: &mut ChaCha8Rng, _| (place(rng, 0.3), 0.8);
        assert!(traffic
            .run(&mut alarm, &bands, 10_000, &mut healthy)
            .is_empty());
        let mut faulty = |rng: &mut ChaCha8Rng, _| {
            let block = place(rng, 0.3);
            (block, if block > 65_535 { 0.25 } else { 0.8 })
        };
        let changes = traffic.run(&mut alarm, &bands, 10_000, &mut faulty);
        let [BandAlarmChange::Raised(lows)] = &changes[..] else {
            panic!("{changes:?}");
        };
        assert!(alarm.raised());
        let positions: Vec<usize> = lows.iter().map(|l| l.position).collect();
        assert_eq!(positions, [0, 1, 2]);
        let text = band_alarm_message(lows, &bands, Some(69_990));
        assert!(
            text.starts_with(
                "spec: draft acceptance depends on where the draft KV lives: position 0: \
                 blocks 65536-69999 (draft KV bytes [2 GiB, 2.14 GiB)) accepted "
            ),
            "{text}"
        );
        for needle in [
            " position 1: blocks 65536-69999",
            " position 2: blocks 65536-69999",
            "below block 65536, z -",
            "by band blocks 0-65535 ",
            " largest KV block id in use 69990",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let changes = traffic.run(&mut alarm, &bands, 10_000, &mut healthy);
        assert_eq!(changes, [BandAlarmChange::Cleared]);
        assert!(!alarm.raised());
    }

    #[test]
    fn a_band_with_few_requests_or_few_drafts_stays_quiet() {
        let bands = two_bands();
        // One request in 40 lives past 65,535 and accepts nothing: hundreds of its drafts
        // are in the window, but from fewer than 8 requests.
        let mut alarm = alarm();
        let mut traffic = Traffic::new(3);
        let mut few = |rng: &mut ChaCha8Rng, n: u64| {
            if n.is_multiple_of(40) {
                (rng.random_range(65_536..70_000), 0.0)
            } else {
                (place(rng, 0.0), 0.8)
            }
        };
        assert!(traffic.run(&mut alarm, &bands, 20_000, &mut few).is_empty());
        // One verification in 200 comes from a request past 65,535 that accepts nothing:
        // 30 such requests, but never 30 drafts at a position in the window.
        let mut alarm = alarm_window_full_of(0.8);
        for i in 0..6000u64 {
            if i.is_multiple_of(200) {
                assert_eq!(alarm.record(1, RequestId(1000 + i / 200), 3, 0), None);
            }
            assert_eq!(alarm.record(0, RequestId(i % 50), 3, 3), None);
        }
        assert!(!alarm.raised());
    }

    /// An alarm whose window is full of drafts below block 65,536 accepting `rate`.
    fn alarm_window_full_of(rate: f64) -> BandAlarm {
        let mut alarm = alarm();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for i in 0..4000u64 {
            let accepted = (0..3).take_while(|_| rng.random_bool(rate)).count();
            assert_eq!(alarm.record(0, RequestId(i % 50), 3, accepted), None);
        }
        alarm
    }

    #[test]
    fn one_band_has_nothing_to_compare() {
        let mut alarm = BandAlarm::new(BandAlarmSettings::default(), 1);
        for i in 0..5000 {
            assert_eq!(alarm.record(0, RequestId(i % 20), 3, 0), None);
        }
        assert!(!alarm.raised());
    }
}
