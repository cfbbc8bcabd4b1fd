//! What a soak wave reads from Peregrine's `/metrics` (Prometheus text): the speculative
//! decoding counters, whose difference over a wave gives its acceptance, the acceptance
//! alarm, and the largest KV block id in use.

use std::collections::BTreeMap;

/// Every sample of `name` in the exposition text: its labels (`key="value"` pairs, as
/// written) and its value.
fn series<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (Vec<&'a str>, f64)> + 'a {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(move |line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels.split(',').filter(|l| !l.is_empty()).collect();
            let value = value.parse().ok()?;
            (series_name == name).then_some((labels, value))
        })
}

/// The value of label `key` in `labels`.
fn label<'a>(labels: &[&'a str], key: &str) -> Option<&'a str> {
    labels.iter().find_map(|l| {
        let value = l.strip_prefix(key)?.strip_prefix("=\"")?;
        value.strip_suffix('"')
    })
}

/// One sample of the exposition text: the value of `name` whose labels include every pair
/// of `labels` (the first such line), if there is one.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    series(text, name)
        .find(|(have, _)| labels.iter().all(|(k, v)| label(have, k) == Some(*v)))
        .map(|(_, value)| value)
}

/// Draft tokens verified and accepted per band of block ids (`blocks FIRST-LAST`, the
/// band of the sequence's largest block id), over every draft position.
pub fn bands(text: &str) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let names = [
        "peregrine:spec_decode_band_draft_tokens_total",
        "peregrine:spec_decode_band_accepted_tokens_total",
    ];
    for (i, name) in names.into_iter().enumerate() {
        for (labels, value) in series(text, name) {
            if let Some(band) = label(&labels, "band") {
                let entry = out.entry(band.to_owned()).or_default();
                if i == 0 {
                    entry.0 += value;
                } else {
                    entry.1 += value;
                }
            }
        }
    }
    out
}

/// What `bands` counted from `before` to `now`: per band that verified drafts, its draft
/// tokens and their acceptance, in the order of their first block id.
pub fn bands_since(
    now: &BTreeMap<String, (f64, f64)>,
    before: &BTreeMap<String, (f64, f64)>,
) -> Vec<(String, f64, f64)> {
    let first_block = |band: &str| -> u64 {
        band.trim_start_matches("blocks ")
            .split('-')
            .next()
            .and_then(|b| b.parse().ok())
            .unwrap_or(u64::MAX)
    };
    let mut out: Vec<(String, f64, f64)> = now
        .iter()
        .filter_map(|(band, &(drafts, accepted))| {
            let (d0, a0) = before.get(band).copied().unwrap_or_default();
            let drafts = drafts - d0;
            (drafts > 0.0).then(|| (band.clone(), drafts, (accepted - a0) / drafts))
        })
        .collect();
    out.sort_by_key(|(band, _, _)| first_block(band));
    out
}

/// The speculative decoding counters at one moment (0 where a series is absent: nothing
/// counted yet).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecCounters {
    /// Verifications that carried drafts.
    pub verifications: f64,
    /// Draft tokens verified.
    pub draft_tokens: f64,
    /// Draft tokens accepted.
    pub accepted: f64,
    /// Drafts accepted at each position (index 0: the first draft).
    pub accepted_per_position: Vec<f64>,
    /// Times the acceptance-collapse alarm was raised.
    pub alarms: f64,
}

/// Positions the per-position counter is read at: `MAX_SPECULATIVE_TOKENS`.
const POSITIONS: usize = peregrine_config::MAX_SPECULATIVE_TOKENS;

impl SpecCounters {
    /// The counters in `text`.
    pub fn read(text: &str) -> SpecCounters {
        let get = |name| sample(text, name, &[]).unwrap_or(0.0);
        let per_position = (0..POSITIONS)
            .map(|p| {
                let position = p.to_string();
                let labels = [("position", position.as_str())];
                sample(
                    text,
                    "peregrine:spec_decode_num_accepted_tokens_per_pos_total",
                    &labels,
                )
                .unwrap_or(0.0)
            })
            .collect();
        SpecCounters {
            verifications: get("peregrine:spec_decode_num_drafts_total"),
            draft_tokens: get("peregrine:spec_decode_num_draft_tokens_total"),
            accepted: get("peregrine:spec_decode_num_accepted_tokens_total"),
            accepted_per_position: per_position,
            alarms: get("peregrine:spec_decode_acceptance_alarms_total"),
        }
    }

    /// What was counted from `before` to `self`.
    pub fn since(&self, before: &SpecCounters) -> SpecCounters {
        SpecCounters {
            verifications: self.verifications - before.verifications,
            draft_tokens: self.draft_tokens - before.draft_tokens,
            accepted: self.accepted - before.accepted,
            accepted_per_position: self
                .accepted_per_position
                .iter()
                .zip(&before.accepted_per_position)
                .map(|(a, b)| a - b)
                .collect(),
            alarms: self.alarms - before.alarms,
        }
    }

    /// Acceptance at each position up to the last one a draft was accepted at (the first
    /// at least, where drafts were verified): accepted there over verifications with
    /// drafts (the definition `/metrics` and `bench spec` use).
    pub fn per_position(&self) -> Vec<f64> {
        let verifications = self.verifications.max(1.0);
        let reached = self
            .accepted_per_position
            .iter()
            .rposition(|&a| a > 0.0)
            .map_or(usize::from(self.verifications > 0.0), |p| p + 1);
        self.accepted_per_position[..reached]
            .iter()
            .map(|a| a / verifications)
            .collect()
    }

    /// Tokens each verification forward gave: the accepted drafts plus the target's own.
    pub fn tokens_per_verification(&self) -> Option<f64> {
        (self.verifications > 0.0)
            .then(|| (self.accepted + self.verifications) / self.verifications)
    }
}

/// The largest KV block id a request owns now (`peregrine:kv_block_id_max`; -1 when none).
pub fn block_id_max(text: &str) -> Option<i64> {
    sample(text, "peregrine:kv_block_id_max", &[]).map(|v| v as i64)
}

/// Whether the acceptance alarm is raised now.
pub fn alarm_raised(text: &str) -> bool {
    sample(text, "peregrine:spec_decode_acceptance_alarm", &[]).is_some_and(|v| v > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_acceptance_over_a_wave_in_block_order() {
        let line = |name: &str, band: &str, position: u32, value: f64| {
            format!("peregrine:spec_decode_band_{name}_tokens_total{{band=\"blocks {band}\",position=\"{position}\"}} {value}\n")
        };
        let counts = |high: f64| {
            [
                line("draft", "0-65535", 0, 10.0),
                line("draft", "0-65535", 1, 10.0),
                line("accepted", "0-65535", 0, 8.0),
                line("draft", "65536-131071", 0, high),
                line("accepted", "65536-131071", 0, high / 4.0),
            ]
            .concat()
        };
        let (before, now) = (bands(&counts(0.0)), bands(&counts(4.0)));
        assert_eq!(before["blocks 0-65535"], (20.0, 8.0));
        // Only the band past 65,535 verified drafts in between: 1 of 4 accepted.
        let wave = bands_since(&now, &before);
        assert_eq!(wave, [("blocks 65536-131071".to_string(), 4.0, 0.25)]);
        let all = bands_since(&now, &BTreeMap::new());
        assert_eq!(all[0], ("blocks 0-65535".to_string(), 20.0, 0.4));
    }

    const TEXT: &str = "# TYPE peregrine:spec_decode_num_drafts_total counter\n\
        peregrine:spec_decode_num_drafts_total 40\n\
        peregrine:spec_decode_num_draft_tokens_total 120\n\
        peregrine:spec_decode_num_accepted_tokens_total 70\n\
        peregrine:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 36\n\
        peregrine:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 24\n\
        peregrine:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 10\n\
        peregrine:spec_decode_band_draft_tokens_total{band=\"blocks 0-65535\",position=\"0\"} 7\n\
        peregrine:kv_block_id_max 70001\n\
        peregrine:spec_decode_acceptance_alarm 0\n";

    #[test]
    fn counters_and_their_difference_over_a_wave() {
        let now = SpecCounters::read(TEXT);
        assert_eq!(now.accepted_per_position[..4], [36.0, 24.0, 10.0, 0.0]);
        let before = SpecCounters {
            verifications: 20.0,
            draft_tokens: 60.0,
            accepted: 30.0,
            accepted_per_position: vec![16.0, 10.0, 4.0],
            alarms: 0.0,
        };
        let wave = now.since(&before);
        assert_eq!(wave.per_position(), [1.0, 0.7, 0.3]);
        assert_eq!(wave.tokens_per_verification(), Some(3.0));
        assert_eq!(block_id_max(TEXT), Some(70_001));
        assert!(!alarm_raised(TEXT));
        let band = [("position", "0"), ("band", "blocks 0-65535")];
        assert_eq!(
            sample(TEXT, "peregrine:spec_decode_band_draft_tokens_total", &band),
            Some(7.0)
        );
        assert_eq!(bands(TEXT)["blocks 0-65535"], (7.0, 0.0));
        assert_eq!(sample(TEXT, "peregrine:spec_decode_num_drafts", &[]), None);
        assert_eq!(SpecCounters::read("").tokens_per_verification(), None);
        assert!(SpecCounters::read("").per_position().is_empty());
        let none_accepted = SpecCounters {
            verifications: 5.0,
            ..SpecCounters::read("")
        };
        assert_eq!(none_accepted.per_position(), [0.0]);
    }
}
