//! Speculative decoding's numbers: the Prometheus series (see `metrics`), a log line every
//! ten seconds over the interval, such as
//! `spec: accept 72.4% tokens/fwd 3.17 per-position 0.83 0.72 0.61 buckets 0:15% 1:20% 2:15% 3:50%`,
//! and the two acceptance alarms: the whole pool's collapse (`alarm`) and acceptance
//! that depends on the band of block ids a sequence's KV lives in (`band_alarm`).
//! Per-position rates are accepted over proposed at that position; buckets are the share
//! of verifications that accepted 0, 1, ... drafts.
//!
//! At trace level for this module
//! (`--log-level info,peregrine_actors::scheduler::spec::stats=trace`) each verification
//! the band alarm counts is logged as one line, `verification band=B request=R tokens=T
//! drafts=D accepted=A block=K`, in the order the alarm saw them, so a served run's stream
//! can be replayed through [`BandAlarm`] offline.

use crate::messages::{KvUsage, RequestId};
use crate::metrics;
use crate::scheduler::spec::alarm::{AcceptanceAlarm, AlarmChange, AlarmSettings, LowPosition};
use crate::scheduler::spec::band_alarm::{
    band_alarm_message, BandAlarm, BandAlarmChange, BandAlarmSettings,
};
use crate::scheduler::spec::bands::Bands;
use std::fmt::Write;
use std::time::{Duration, Instant};
use tracing::{info, trace, warn};

const LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts over an interval (or since start).
#[derive(Clone, Default, Debug, PartialEq)]
pub struct SpecCounts {
    /// Verifications with drafts.
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    /// Per draft position: (proposed, accepted).
    pub per_position: Vec<(u64, u64)>,
    /// Verifications by accepted drafts.
    pub accepted_length: Vec<u64>,
}

impl SpecCounts {
    fn add(&mut self, drafts: usize, accepted: usize) {
        self.drafts += 1;
        self.draft_tokens += drafts as u64;
        self.accepted_tokens += accepted as u64;
        if self.per_position.len() < drafts {
            self.per_position.resize(drafts, (0, 0));
        }
        for (i, p) in self.per_position.iter_mut().enumerate().take(drafts) {
            p.0 += 1;
            p.1 += u64::from(i < accepted);
        }
        if self.accepted_length.len() <= accepted {
            self.accepted_length.resize(accepted + 1, 0);
        }
        self.accepted_length[accepted] += 1;
    }

    /// Mean tokens emitted per verification (accepted drafts plus one).
    pub fn tokens_per_forward(&self) -> f64 {
        (self.accepted_tokens + self.drafts) as f64 / self.drafts.max(1) as f64
    }

    /// The log line's text after `spec: `.
    pub fn summary(&self) -> String {
        let rate = 100.0 * self.accepted_tokens as f64 / self.draft_tokens.max(1) as f64;
        let mut line = format!(
            "accept {rate:.1}% tokens/fwd {:.2} per-position",
            self.tokens_per_forward()
        );
        for &(proposed, accepted) in &self.per_position {
            let _ = write!(line, " {:.2}", accepted as f64 / proposed.max(1) as f64);
        }
        line.push_str(" buckets");
        for (n, &count) in self.accepted_length.iter().enumerate() {
            let share = 100.0 * count as f64 / self.drafts.max(1) as f64;
            let _ = write!(line, " {n}:{share:.0}%");
        }
        line
    }
}

/// Where a verified request's KV lives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Place {
    /// The request verified.
    pub request: RequestId,
    /// The largest block id in the request's block table (where the draft KV it read
    /// lives); `None` when the request ended while the step ran.
    pub max_block_id: Option<u32>,
    /// The tokens the request held before the step (how far into its text it was).
    pub tokens: usize,
}

/// The scheduler's speculation statistics.
pub struct SpecStats {
    total: SpecCounts,
    interval: SpecCounts,
    last_log: Instant,
    alarm: AcceptanceAlarm,
    bands: Bands,
    band_alarm: BandAlarm,
}

impl SpecStats {
    /// Empty statistics with the default alarms, over the bands of a pool of
    /// `num_blocks` blocks whose draft layer takes `draft_kv_bytes_per_block` bytes a
    /// block in each of its K and V tensors, if known.
    pub fn new(num_blocks: usize, draft_kv_bytes_per_block: Option<u64>) -> SpecStats {
        let bands = Bands::new(num_blocks, draft_kv_bytes_per_block);
        SpecStats {
            total: SpecCounts::default(),
            interval: SpecCounts::default(),
            last_log: Instant::now(),
            alarm: AcceptanceAlarm::new(AlarmSettings::default()),
            band_alarm: BandAlarm::new(BandAlarmSettings::default(), bands.count()),
            bands,
        }
    }

    /// One request's verification: `drafts` proposed, the first `accepted` accepted, by
    /// the request at `place`; `kv` is the pool's state this step, for the alarms. The
    /// step's last verification is followed by [`SpecStats::end_step`].
    pub fn record(&mut self, drafts: usize, accepted: usize, place: Place, kv: &KvUsage) {
        metrics::record_verification(drafts, accepted);
        self.total.add(drafts, accepted);
        self.interval.add(drafts, accepted);
        metrics::record_tokens_per_forward(self.total.tokens_per_forward());
        self.alarm.record(drafts, accepted);
        if let Some(block) = place.max_block_id {
            let band = self.bands.of(block);
            trace!(
                band,
                request = place.request.0,
                tokens = place.tokens,
                drafts,
                accepted,
                block,
                "verification"
            );
            metrics::record_band_verification(self.bands.name(band), drafts, accepted);
            match self
                .band_alarm
                .record(band, place.request, place.tokens, drafts, accepted)
            {
                Some(BandAlarmChange::Raised(lows)) => {
                    warn!(
                        largest_kv_block_id_in_use = ?kv.max_block_id_in_use,
                        "{}",
                        band_alarm_message(&lows, &self.bands, kv.max_block_id_in_use)
                    );
                    metrics::record_acceptance_alarm(true);
                }
                Some(BandAlarmChange::Cleared) => {
                    info!("spec: draft acceptance no longer depends on the block ids");
                    self.alarm_cleared();
                }
                None => {}
            }
        }
        if self.last_log.elapsed() >= LOG_EVERY {
            info!("spec: {}", self.interval.summary());
            self.interval = SpecCounts::default();
            self.last_log = Instant::now();
        }
    }

    /// Ends a step whose verifications [`SpecStats::record`] took (the whole-pool alarm
    /// counts in steps); `kv` is the pool's state this step.
    pub fn end_step(&mut self, kv: &KvUsage) {
        match self.alarm.end_step() {
            Some(AlarmChange::Raised(low)) => {
                warn!(
                    largest_kv_block_id_in_use = ?kv.max_block_id_in_use,
                    "{}",
                    alarm_message(&low, kv)
                );
                metrics::record_acceptance_alarm(true);
            }
            Some(AlarmChange::Cleared) => {
                info!("spec: draft acceptance recovered");
                self.alarm_cleared();
            }
            None => {}
        }
    }

    /// One alarm cleared: the gauge goes to 0 unless the other is still raised.
    fn alarm_cleared(&self) {
        if !self.alarm.raised() && !self.band_alarm.raised() {
            metrics::record_acceptance_alarm(false);
        }
    }
}

/// The warning logged when the alarm is raised.
fn alarm_message(low: &[LowPosition], kv: &KvUsage) -> String {
    let mut text = String::from("spec: draft acceptance collapsed:");
    for l in low {
        let _ = write!(
            text,
            " position {}: {}/{} accepted in the window vs {:.1}% long-run;",
            l.position,
            l.window_accepted,
            l.window_len,
            100.0 * l.long_run
        );
    }
    let block = kv
        .max_block_id_in_use
        .map_or("none".to_string(), |b| b.to_string());
    let _ = write!(text, " largest KV block id in use {block}");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alarm_warning_names_positions_window_and_block_id() {
        let low = [LowPosition {
            position: 1,
            window_accepted: 12,
            window_len: 100,
            long_run: 0.815,
        }];
        let kv = KvUsage {
            max_block_id_in_use: Some(65_536),
            ..KvUsage::default()
        };
        assert_eq!(
            alarm_message(&low, &kv),
            "spec: draft acceptance collapsed: position 1: 12/100 accepted in the window vs \
             81.5% long-run; largest KV block id in use 65536"
        );
    }

    #[test]
    fn the_summary_reads_as_documented() {
        let mut c = SpecCounts::default();
        c.add(3, 3);
        c.add(3, 1);
        c.add(3, 0);
        c.add(2, 2);
        // 6 of 11 accepted; tokens 4+2+1+3 over 4 forwards.
        assert_eq!(
            c.summary(),
            "accept 54.5% tokens/fwd 2.50 per-position 0.75 0.50 0.33 buckets 0:25% 1:25% 2:25% 3:25%"
        );
    }
}
