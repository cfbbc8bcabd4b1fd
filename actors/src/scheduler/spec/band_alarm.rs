//! The band alarm: acceptance that depends on where a sequence's draft KV lives. The
//! incident it is built for: an EAGLE-3 draft layer past 2 GiB whose acceptance fell from
//! 80% to 25% once block ids passed 65,535, because a kernel computed wrong addresses for
//! the high blocks. A change of workload moves the acceptance of every band alike; a
//! fault of addressing moves only the bands past a limit.
//!
//! The window is the last `window` (20,000) verifications of every band together, each
//! placed in the band ([`Bands`]) of its sequence's largest block id and in the stratum
//! of its sequence's length (`stratum_tokens`, 32, tokens a stratum). Every `check_every`
//! (1,000) verifications, for each draft position p and each band boundary B, the drafts at
//! p of the verifications placed at or past B (side U) are compared with those placed
//! before B (side L), stratum by stratum: sequences reach higher block ids as they grow,
//! and where many requests run in step (waves of one prompt) a band is also a stretch of
//! the text, so only drafts at the same length are compared, by a stratified
//! two-proportion z-test (`band_test.rs`).
//!
//! A comparison is low when each side has at least `min_proposed` (30) drafts at p in the
//! strata both have, from at least `min_requests` (8) requests, `z < z_below` (-4:
//! p < 3.2e-5 one-sided, so that the few dozen comparisons of each check do not raise it
//! by chance) and the upper side has lost at least `min_drop` (0.3) of the lower side's
//! rate at equal lengths, `-D >= min_drop * R` with `R = sum_s w_s a_L/n_L / W` (with
//! thousands of drafts, small differences between bands are significant without being a
//! fault; the incident lost 0.69 of its rate, 80% to 25%). The loss is relative because
//! the rates fall with the position: a later position that falls from 20% to 3% has lost
//! as much as the first falling from 60% to 9%. The alarm is raised when some comparison
//! is low at `sustain` (3) consecutive checks, and cleared when the comparisons that
//! raised it have their data again and none is low for as many checks. Only upper sides
//! are suspects, the shape of an address that goes wrong past a limit; the lowest band
//! never is.

pub use super::band_test::{BandLow, Side};
use super::band_test::{Cell, Key, Placed, Thresholds, Verdict, Window};
use crate::messages::RequestId;
use crate::scheduler::spec::bands::Bands;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write;

/// When the band alarm fires.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BandAlarmSettings {
    /// Verifications of every band together in the sliding window.
    pub window: usize,
    /// Sequence lengths (in tokens) of one stratum.
    pub stratum_tokens: usize,
    /// Verifications between two checks.
    pub check_every: usize,
    /// Drafts each side of a comparison needs at the position.
    pub min_proposed: u64,
    /// Requests each side of a comparison needs at the position.
    pub min_requests: u64,
    /// The z statistic below which a side may be low.
    pub z_below: f64,
    /// The share (0..1) of the lower side's rate the upper side must have lost.
    pub min_drop: f64,
    /// Consecutive checks that raise the alarm, and clear it.
    pub sustain: usize,
}

impl Default for BandAlarmSettings {
    fn default() -> Self {
        BandAlarmSettings {
            window: 20_000,
            stratum_tokens: 32,
            check_every: 1000,
            min_proposed: 30,
            min_requests: 8,
            z_below: -4.0,
            min_drop: 0.3,
            sustain: 3,
        }
    }
}

impl BandAlarmSettings {
    /// When one comparison is thin or low.
    fn thresholds(&self) -> Thresholds {
        Thresholds {
            min_proposed: self.min_proposed,
            min_requests: self.min_requests,
            z_below: self.z_below,
            min_drop: self.min_drop,
        }
    }
}

/// What a verification did to the band alarm.
#[derive(Clone, Debug, PartialEq)]
pub enum BandAlarmChange {
    /// Raised, with the lowest comparison of each low position.
    Raised(Vec<BandLow>),
    /// Cleared: the comparisons that raised it are fine again.
    Cleared,
}

/// Where a verification's drafts are counted: its band, request and stratum.
type CellKey = (usize, RequestId, usize);

/// One verification in the window.
struct Entry {
    cell: CellKey,
    drafts: usize,
    accepted: usize,
}

/// The band alarm's state.
pub struct BandAlarm {
    settings: BandAlarmSettings,
    bands: usize,
    entries: VecDeque<Entry>,
    cells: HashMap<CellKey, Cell>,
    /// Draft positions seen in the window's verifications (the most drafts of one).
    positions: usize,
    since_check: usize,
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
            cells: HashMap::new(),
            positions: 0,
            since_check: 0,
            low_streak: 0,
            quiet_streak: 0,
            raised: None,
        }
    }

    /// Whether the alarm is raised.
    pub fn raised(&self) -> bool {
        self.raised.is_some()
    }

    /// One verification of `request`, placed in `band`, whose sequence held `tokens`
    /// tokens: `drafts` proposed, the first `accepted` accepted. Returns the change of
    /// state, if any (only a verification that ends a check interval changes it).
    pub fn record(
        &mut self,
        band: usize,
        request: RequestId,
        tokens: usize,
        drafts: usize,
        accepted: usize,
    ) -> Option<BandAlarmChange> {
        if self.bands < 2 {
            return None;
        }
        let stratum = tokens / self.settings.stratum_tokens.max(1);
        let entry = Entry {
            cell: (band.min(self.bands - 1), request, stratum),
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
        self.since_check += 1;
        if self.since_check < self.settings.check_every.max(1) {
            return None;
        }
        self.since_check = 0;
        self.check()
    }

    /// Adds `e` to its cell, or takes it away.
    fn apply(&mut self, e: &Entry, add: bool) {
        self.positions = self.positions.max(e.drafts);
        let cell = self.cells.entry(e.cell).or_default();
        if cell.per_position.len() < e.drafts {
            cell.per_position.resize(e.drafts, (0, 0));
        }
        for (i, slot) in cell.per_position.iter_mut().enumerate().take(e.drafts) {
            let ok = u64::from(i < e.accepted);
            *slot = if add {
                (slot.0 + 1, slot.1 + ok)
            } else {
                (slot.0 - 1, slot.1 - ok)
            };
        }
        if add {
            cell.verifications += 1;
        } else {
            cell.verifications -= 1;
            if cell.verifications == 0 {
                self.cells.remove(&e.cell);
            }
        }
    }

    /// Every comparison now, by (position, from), and the low ones' findings.
    fn comparisons(&self) -> (Vec<(Key, Verdict)>, Vec<BandLow>) {
        // Dense indices of the window's requests and strata, for this check.
        let mut requests: HashMap<RequestId, usize> = HashMap::new();
        let mut strata: HashMap<usize, usize> = HashMap::new();
        let cells: Vec<Placed> = self
            .cells
            .iter()
            .map(|(&(band, request, stratum), cell)| {
                let next = requests.len();
                let request = *requests.entry(request).or_insert(next);
                let next = strata.len();
                let stratum = *strata.entry(stratum).or_insert(next);
                Placed {
                    band,
                    request,
                    stratum,
                    cell,
                }
            })
            .collect();
        let window = Window {
            cells,
            requests: requests.len(),
            strata: strata.len(),
            bands: self.bands,
        };
        let (mut verdicts, mut lows) = (Vec::new(), Vec::new());
        let s = &self.settings;
        for position in 0..self.positions {
            let at = window.at(position);
            let by_band = window.sums(&at);
            let per_band: Vec<(u64, u64)> = (0..self.bands)
                .map(|band| {
                    let cells = (0..window.strata).map(|s| by_band[s * self.bands + band]);
                    cells.fold((0, 0), |(a, n), (cn, ca)| (a + ca, n + cn))
                })
                .collect();
            for from in 1..self.bands {
                // A side with too few drafts in every stratum together is thin already.
                let drafts = |bands: &[(u64, u64)]| bands.iter().map(|b| b.1).sum::<u64>();
                if drafts(&per_band[from..]).min(drafts(&per_band[..from])) < s.min_proposed {
                    verdicts.push(((position, from), Verdict::Thin));
                    continue;
                }
                let key = (position, from);
                let (verdict, finding) =
                    window.compare(&s.thresholds(), key, &at, &by_band, &per_band);
                verdicts.push(((position, from), verdict));
                if verdict == Verdict::Low {
                    lows.push(finding);
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
/// every band, the stratified gap and its z statistic; then the largest KV block id in use.
pub fn band_alarm_message(lows: &[BandLow], bands: &Bands, largest: Option<u32>) -> String {
    let mut text = String::from("spec: draft acceptance depends on where the draft KV lives:");
    for l in lows {
        let _ = write!(
            text,
            " position {}: {} accepted {}/{} ({:.1}%, {} requests) vs {}/{} ({:.1}%, {} \
             requests) below block {}, {:+.1} points at equal lengths ({:.0}% of the rate \
             lost), z {:.1}, by band",
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
            100.0 * l.gap,
            100.0 * l.drop,
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
        tokens: usize,
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
                    let tokens = self.rng.random_range(20..200);
                    self.running.push(Running {
                        id: RequestId(self.started),
                        block,
                        rate,
                        left,
                        tokens,
                    });
                    self.started += 1;
                }
                let i = self.rng.random_range(0..self.running.len());
                let r = &mut self.running[i];
                let accepted = (0..3).take_while(|_| self.rng.random_bool(r.rate)).count();
                changes.extend(alarm.record(bands.of(r.block), r.id, r.tokens, 3, accepted));
                r.tokens += accepted + 1;
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
        let changes = traffic.run(&mut alarm, &bands, 20_000, &mut faulty);
        let [BandAlarmChange::Raised(lows)] = &changes[..] else {
            panic!("{changes:?}");
        };
        assert!(alarm.raised());
        let positions: Vec<usize> = lows.iter().map(|l| l.position).collect();
        // The later positions lose more of their rate (0.25^(p+1) of 0.8^(p+1): 69%, 90%,
        // 97%) and raise it first.
        assert_eq!(positions, [1, 2]);
        let text = band_alarm_message(lows, &bands, Some(69_990));
        assert!(
            text.starts_with(
                "spec: draft acceptance depends on where the draft KV lives: position 1: \
                 blocks 65536-69999 (draft KV bytes [2 GiB, 2.14 GiB)) accepted "
            ),
            "{text}"
        );
        for needle in [
            " position 2: blocks 65536-69999",
            "below block 65536, -",
            " points at equal lengths (",
            "% of the rate lost), z -",
            "by band blocks 0-65535 ",
            " largest KV block id in use 69990",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let changes = traffic.run(&mut alarm, &bands, 40_000, &mut healthy);
        assert_eq!(changes, [BandAlarmChange::Cleared]);
        assert!(!alarm.raised());
    }

    #[test]
    fn a_band_with_few_requests_or_few_drafts_stays_quiet() {
        let bands = two_bands();
        // One request in 200 lives past 65,535 and accepts nothing: dozens of its drafts
        // are in the window, but from fewer than 8 requests.
        let mut alarm = alarm();
        let mut traffic = Traffic::new(3);
        let mut few = |rng: &mut ChaCha8Rng, n: u64| {
            if n.is_multiple_of(200) {
                (rng.random_range(65_536..70_000), 0.0)
            } else {
                (place(rng, 0.0), 0.8)
            }
        };
        assert!(traffic.run(&mut alarm, &bands, 20_000, &mut few).is_empty());
        // One verification in 250 comes from a request past 65,535 that accepts nothing:
        // 24 such requests, never 30 drafts at a position in the window.
        let mut alarm = alarm_window_full_of(0.8);
        for i in 0..6000u64 {
            if i.is_multiple_of(250) {
                assert_eq!(alarm.record(1, RequestId(1000 + i / 250), 100, 3, 0), None);
            }
            assert_eq!(alarm.record(0, RequestId(i % 50), 100, 3, 3), None);
        }
        assert!(!alarm.raised());
    }

    /// An alarm whose window is full of drafts below block 65,536 accepting `rate`.
    fn alarm_window_full_of(rate: f64) -> BandAlarm {
        let mut alarm = alarm();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for i in 0..20_000u64 {
            let accepted = (0..3).take_while(|_| rng.random_bool(rate)).count();
            assert_eq!(alarm.record(0, RequestId(i % 50), 100, 3, accepted), None);
        }
        alarm
    }

    /// The soak's shape: waves of 64 requests of one prompt at temperature 0, in step, so
    /// that every request of a wave verifies the same drafts with the same outcome at the
    /// same length; each block of 4 tokens is a never-used one, so the ids pass 65,535
    /// within wave 16 and a band is also a stretch of the text. The text has stretches the
    /// head drafts well and stretches it drafts badly. `fault(rng, accepted, share)` gives
    /// what a request past block 65,535 accepts instead, `share` being the part of its
    /// generated tokens' blocks past 65,535.
    fn waves(fault: &mut impl FnMut(&mut ChaCha8Rng, usize, f64) -> usize) -> Vec<BandAlarmChange> {
        // 32 KiB a block: the bands break at block 65,536 (2 GiB) only.
        let bands = Bands::new(131_072, Some(32 << 10));
        assert_eq!(bands.count(), 2);
        let mut alarm = alarm();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut next_block = 0u32;
        let mut changes = Vec::new();
        for wave in 0..25u64 {
            let mut text = ChaCha8Rng::seed_from_u64(7);
            let mut tokens = 30usize;
            // Per request: its largest block, and its blocks in all and past 65,535.
            let mut held = [(0u32, 0u32, 0u32); 64];
            for step in 0..120 {
                let rate = if (step / 12) % 3 == 0 { 0.05 } else { 0.85 };
                let accepted = (0..3).take_while(|_| text.random_bool(rate)).count();
                for (r, (block, owned, high)) in held.iter_mut().enumerate() {
                    // A new block for the first generated token and for each 4 after.
                    if step == 0 || (tokens + accepted + 1) / 4 > tokens / 4 {
                        *block = next_block;
                        *owned += 1;
                        *high += u32::from(next_block > 65_535);
                        next_block += 1;
                    }
                    let id = RequestId(wave * 64 + r as u64);
                    let got = if *block > 65_535 {
                        fault(&mut rng, accepted, f64::from(*high) / f64::from(*owned))
                    } else {
                        accepted
                    };
                    changes.extend(alarm.record(bands.of(*block), id, tokens, 3, got));
                }
                tokens += accepted + 1;
            }
        }
        assert!(
            (70_000..=131_072).contains(&next_block),
            "{next_block}: ids pass 65,535, within the pool"
        );
        changes
    }

    #[test]
    fn waves_of_one_prompt_stay_quiet_and_a_fault_past_65535_raises_it() {
        assert_eq!(waves(&mut |_, accepted, _| accepted), []);
        // Every request past the limit loses its drafts in 0.6 of its verifications; then,
        // in the soak fault's shape (the head's KV zeroed past the limit, which took 0.52,
        // 0.79 and 0.84 of positions 0, 1 and 2 once every generated token's KV was past
        // it), each of its drafts is rejected with a chance that grows with its KV past
        // the limit, up to 0.5.
        let flat = |rng: &mut ChaCha8Rng, accepted, _| {
            if rng.random_bool(0.6) {
                0
            } else {
                accepted
            }
        };
        let growing = |rng: &mut ChaCha8Rng, accepted, share: f64| {
            (0..accepted)
                .take_while(|_| !rng.random_bool(0.5 * share))
                .count()
        };
        for changes in [waves(&mut { flat }), waves(&mut { growing })] {
            let [BandAlarmChange::Raised(lows), ..] = &changes[..] else {
                panic!("{changes:?}");
            };
            assert!(lows.iter().all(|l| l.drop >= 0.3), "{lows:?}");
        }
    }

    #[test]
    fn a_late_position_losing_most_of_a_low_rate_raises_it() {
        // Positions 0 and 1 accept alike in both bands (0.9, 0.81); past block 65,535
        // position 2 falls from 0.20 to 0.08: 12 points, but 60% of its rate.
        let mut alarm = alarm();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut changes = Vec::new();
        for i in 0..30_000u64 {
            let (band, request) = (usize::from(i % 2 == 1), RequestId(i % 100));
            let last = if band == 1 { 0.1 } else { 0.25 };
            let accepted = [0.9, 0.9, last]
                .iter()
                .take_while(|&&p| rng.random_bool(p))
                .count();
            let tokens = rng.random_range(20..400);
            changes.extend(alarm.record(band, request, tokens, 3, accepted));
        }
        let [BandAlarmChange::Raised(lows), ..] = &changes[..] else {
            panic!("{changes:?}");
        };
        let [low] = &lows[..] else {
            panic!("{lows:?}");
        };
        assert_eq!(low.position, 2);
        assert!(low.gap > -0.2 && low.drop > 0.5, "{low:?}");
    }

    #[test]
    fn one_band_has_nothing_to_compare() {
        let mut alarm = BandAlarm::new(BandAlarmSettings::default(), 1);
        for i in 0..5000 {
            assert_eq!(alarm.record(0, RequestId(i % 20), 100, 3, 0), None);
        }
        assert!(!alarm.raised());
    }
}
