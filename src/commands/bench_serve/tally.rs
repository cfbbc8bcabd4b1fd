//! The counts beside the latencies: the requests by kind of constrained output, and the
//! completed requests by finish reason, so that two runs show constrained against
//! unconstrained load.

use super::constraint::Constraint;
use super::stats::RequestMetrics;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// How many requests were constrained, by kind, and how the completed ones ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    /// The requests sent of each kind, every kind in [`Constraint::ALL`]'s order.
    pub constrained: Vec<(Constraint, usize)>,
    /// The completed requests by the finish reason their stream gave (those whose
    /// stream gave none are left out).
    pub finish_reasons: BTreeMap<String, usize>,
}

impl Tally {
    /// Counts the requests' kinds (in prompt order, as their results).
    pub fn new(
        constraints: &[Option<Constraint>],
        results: &[Result<RequestMetrics, String>],
    ) -> Self {
        let constrained = Constraint::ALL
            .iter()
            .map(|&kind| {
                let count = constraints.iter().filter(|c| **c == Some(kind)).count();
                (kind, count)
            })
            .collect();
        let mut finish_reasons = BTreeMap::new();
        for reason in results
            .iter()
            .filter_map(|r| r.as_ref().ok()?.finish_reason.clone())
        {
            *finish_reasons.entry(reason).or_insert(0) += 1;
        }
        Self {
            constrained,
            finish_reasons,
        }
    }

    /// How many requests were constrained.
    pub fn constrained_total(&self) -> usize {
        self.constrained.iter().map(|(_, count)| count).sum()
    }

    /// The table's value for the constrained requests: the total, then the kinds that
    /// occur, like `3 (json_schema 2, tools 1)`.
    pub fn constrained_text(&self) -> String {
        let kinds: Vec<String> = self
            .constrained
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(kind, count)| format!("{} {count}", kind.name()))
            .collect();
        if kinds.is_empty() {
            "0".into()
        } else {
            format!("{} ({})", self.constrained_total(), kinds.join(", "))
        }
    }

    /// The table's value for the finish reasons, like `length 4, stop 2`; `-` for none.
    pub fn finish_reasons_text(&self) -> String {
        let reasons: Vec<String> = self
            .finish_reasons
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        if reasons.is_empty() {
            "-".into()
        } else {
            reasons.join(", ")
        }
    }

    /// The counts as result-file fields: `constrained_requests`, `constraint_counts`
    /// (every kind, 0 included) and `finish_reason_counts`.
    pub fn json_fields(&self) -> [(&'static str, Value); 3] {
        let kinds: Map<String, Value> = self
            .constrained
            .iter()
            .map(|(kind, count)| (kind.name().to_owned(), json!(count)))
            .collect();
        [
            ("constrained_requests", json!(self.constrained_total())),
            ("constraint_counts", Value::Object(kinds)),
            ("finish_reason_counts", json!(self.finish_reasons)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(reason: Option<&str>) -> Result<RequestMetrics, String> {
        Ok(RequestMetrics {
            input_tokens: 1,
            output_tokens: 1,
            ttft: 0.1,
            e2e: 0.1,
            itl: vec![],
            finish_reason: reason.map(String::from),
        })
    }

    #[test]
    fn counts_kinds_and_finish_reasons() {
        let constraints = [
            Some(Constraint::Tools),
            None,
            Some(Constraint::JsonSchema),
            Some(Constraint::Tools),
            None,
        ];
        let results = [
            ended(Some("tool_calls")),
            ended(Some("length")),
            ended(Some("stop")),
            Err("HTTP 400".into()),
            ended(None),
        ];
        let tally = Tally::new(&constraints, &results);
        assert_eq!(tally.constrained_total(), 3);
        assert_eq!(tally.constrained_text(), "3 (json_schema 1, tools 2)");
        assert_eq!(
            tally.finish_reasons_text(),
            "length 1, stop 1, tool_calls 1"
        );
        let fields = Value::Object(
            tally
                .json_fields()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        );
        assert_eq!(
            fields,
            json!({
                "constrained_requests": 3,
                "constraint_counts": {"json_schema": 1, "json_object": 0, "regex": 0,
                                      "choice": 0, "grammar": 0, "tools": 2},
                "finish_reason_counts": {"length": 1, "stop": 1, "tool_calls": 1},
            })
        );
    }

    #[test]
    fn an_unconstrained_run() {
        let tally = Tally::new(&[None, None], &[Err("x".into()), Err("y".into())]);
        assert_eq!(
            (tally.constrained_text(), tally.finish_reasons_text()),
            ("0".to_owned(), "-".to_owned())
        );
    }
}
