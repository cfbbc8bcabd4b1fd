//! The results: vLLM's table, the JSON for `--result-file`, and the command that reruns it.

use super::constraint::Constraint;
use super::stats::{Distribution, RequestMetrics, Summary};
use super::tally::Tally;
use crate::cli::BenchServeArgs;
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// Everything a finished run measured.
pub struct Report {
    /// The command line that reruns this benchmark.
    pub command: String,
    /// The model the requests named.
    pub model: String,
    /// The most requests in flight at once.
    pub concurrency: usize,
    /// Each request's kind of constrained output, in prompt order.
    pub constraints: Vec<Option<Constraint>>,
    /// Each request's numbers or error, in prompt order.
    pub results: Vec<Result<RequestMetrics, String>>,
    /// The totals, rates and distributions.
    pub summary: Summary,
    /// The requests by constraint kind and finish reason.
    pub tally: Tally,
    /// Prompt tokens the server computed during the run (not found in its prefix cache),
    /// from its `/metrics` where it counts them (Peregrine's).
    pub prompt_tokens_computed: Option<u64>,
}

impl Report {
    /// Summarises the results of a run that took `duration` seconds; `constraints` are
    /// the requests' kinds, in the results' order.
    pub fn new(
        args: &BenchServeArgs,
        model: String,
        constraints: Vec<Option<Constraint>>,
        results: Vec<Result<RequestMetrics, String>>,
        duration: f64,
    ) -> Self {
        let successes: Vec<&RequestMetrics> =
            results.iter().filter_map(|r| r.as_ref().ok()).collect();
        let summary = Summary::new(&successes, results.len() - successes.len(), duration);
        let tally = Tally::new(&constraints, &results);
        Self {
            command: command_line(args, &model),
            model,
            concurrency: args.concurrency,
            constraints,
            results,
            summary,
            tally,
            prompt_tokens_computed: None,
        }
    }

    /// The first failed request's error, if any failed.
    pub fn first_error(&self) -> Option<&str> {
        self.results
            .iter()
            .find_map(|r| r.as_ref().err().map(String::as_str))
    }

    /// The table printed at the end, in the layout of `vllm bench serve`.
    pub fn table(&self) -> String {
        let s = &self.summary;
        let mut out = format!("{:=^50}\n", " Serving Benchmark Result ");
        let mut row = |label: &str, value: String| {
            let _ = writeln!(out, "{label:<40} {value}");
        };
        row("Successful requests:", s.completed.to_string());
        row("Failed requests:", s.failed.to_string());
        row("Maximum request concurrency:", self.concurrency.to_string());
        row("Benchmark duration (s):", format!("{:.2}", s.duration));
        row("Total input tokens:", s.total_input_tokens.to_string());
        row("Total generated tokens:", s.total_output_tokens.to_string());
        if let Some(computed) = self.prompt_tokens_computed {
            row("Prompt tokens computed (server):", computed.to_string());
        }
        row(
            "Request throughput (req/s):",
            format!("{:.2}", s.request_throughput),
        );
        row(
            "Output token throughput (tok/s):",
            format!("{:.2}", s.output_throughput),
        );
        row(
            "Total token throughput (tok/s):",
            format!("{:.2}", s.total_token_throughput),
        );
        row("Constrained requests:", self.tally.constrained_text());
        row("Finish reasons:", self.tally.finish_reasons_text());
        for (title, name, d) in distributions(s) {
            let _ = writeln!(out, "{:-^50}", title);
            for (stat, value) in [
                ("Mean", d.mean),
                ("Median", d.median),
                ("P90", d.p90),
                ("P99", d.p99),
            ] {
                let _ = writeln!(out, "{:<40} {value:.2}", format!("{stat} {name} (ms):"));
            }
        }
        let _ = writeln!(out, "{}", "=".repeat(50));
        if let Some(error) = self.first_error() {
            let _ = writeln!(out, "First error ({} failed): {error}", s.failed);
        }
        let _ = writeln!(out, "Reproduce with: {}", self.command);
        out
    }

    /// The same numbers as JSON, with vLLM's key names, plus the constraint and finish
    /// reason counts and per-request arrays in prompt order (times in seconds; `null`
    /// and an error string for a failure; `null` for no constraint or finish reason).
    pub fn json(&self) -> Value {
        let s = &self.summary;
        let mut fields = Map::new();
        let mut put = |key: String, value: Value| {
            fields.insert(key, value);
        };
        put("command".into(), json!(self.command));
        put("model_id".into(), json!(self.model));
        put("max_concurrency".into(), json!(self.concurrency));
        put("num_prompts".into(), json!(self.results.len()));
        put("duration".into(), json!(s.duration));
        put("completed".into(), json!(s.completed));
        put("failed".into(), json!(s.failed));
        put("total_input_tokens".into(), json!(s.total_input_tokens));
        put("total_output_tokens".into(), json!(s.total_output_tokens));
        put(
            "server_prompt_tokens_computed".into(),
            json!(self.prompt_tokens_computed),
        );
        put("request_throughput".into(), json!(s.request_throughput));
        put("output_throughput".into(), json!(s.output_throughput));
        put(
            "total_token_throughput".into(),
            json!(s.total_token_throughput),
        );
        for (_, name, d) in distributions(s) {
            let name = name.to_lowercase();
            put(format!("mean_{name}_ms"), json!(d.mean));
            put(format!("median_{name}_ms"), json!(d.median));
            put(format!("p90_{name}_ms"), json!(d.p90));
            put(format!("p99_{name}_ms"), json!(d.p99));
        }
        for (key, value) in self.tally.json_fields() {
            put(key.into(), value);
        }
        let each = |f: fn(&RequestMetrics) -> Value| -> Value {
            self.results
                .iter()
                .map(|r| r.as_ref().map_or(Value::Null, f))
                .collect()
        };
        put("input_lens".into(), each(|m| json!(m.input_tokens)));
        put("output_lens".into(), each(|m| json!(m.output_tokens)));
        put("ttfts".into(), each(|m| json!(m.ttft)));
        put("e2els".into(), each(|m| json!(m.e2e)));
        put("itls".into(), each(|m| json!(m.itl)));
        put("finish_reasons".into(), each(|m| json!(m.finish_reason)));
        let kinds: Vec<Option<&str>> = self
            .constraints
            .iter()
            .map(|c| c.map(Constraint::name))
            .collect();
        put("constraints".into(), json!(kinds));
        let errors: Vec<&str> = self
            .results
            .iter()
            .map(|r| r.as_ref().err().map_or("", String::as_str))
            .collect();
        put("errors".into(), json!(errors));
        Value::Object(fields)
    }
}

/// The four latencies with their table titles and short names.
fn distributions(s: &Summary) -> [(&'static str, &'static str, Distribution); 4] {
    [
        ("Time to First Token", "TTFT", s.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", s.tpot),
        ("Inter-token Latency", "ITL", s.itl),
        ("End-to-end Latency", "E2EL", s.e2e),
    ]
}

/// The command that reruns this benchmark, with every default spelled out and the
/// resolved model pinned; an API key is shown as a placeholder.
fn command_line(args: &BenchServeArgs, model: &str) -> String {
    let mut words: Vec<String> = ["peregrine", "bench", "serve", "--url"]
        .map(String::from)
        .to_vec();
    words.push(args.url.clone());
    words.extend(["--model".into(), model.to_owned()]);
    words.extend(["--num-prompts".into(), args.num_prompts.to_string()]);
    words.extend(["--concurrency".into(), args.concurrency.to_string()]);
    match &args.dataset {
        Some(path) => words.extend(["--dataset".into(), path.display().to_string()]),
        None => {
            words.extend(["--input-len".into(), args.input_len.to_string()]);
            words.extend(["--seed".into(), args.seed.to_string()]);
        }
    }
    words.extend(["--output-len".into(), args.output_len.to_string()]);
    if args.n > 1 {
        words.extend(["--n".into(), args.n.to_string()]);
    }
    let mut line: Vec<String> = words.iter().map(|w| shell_quote(w)).collect();
    if args.api_key.is_some() {
        line.push("--api-key <KEY>".into());
    }
    line.join(" ")
}

/// `word` quoted for a POSIX shell when it holds anything beyond plain characters.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bench_serve::request::PrefillCounts;

    #[test]
    fn prefill_counts_come_from_peregrine_metrics() {
        let text = "# TYPE peregrine:prompt_tokens_total counter\n\
                    peregrine:prompt_tokens_total 500\n\
                    peregrine:prefix_cache_hits_total 96\n\
                    peregrine:prompt_tokens_totalx 7\n";
        let after = PrefillCounts::parse(text).unwrap();
        assert_eq!(after.prompt_tokens, 500.0);
        let before = PrefillCounts {
            prompt_tokens: 100.0,
            cached_tokens: 32.0,
        };
        assert_eq!(after.computed_since(&before), 336);
        assert_eq!(PrefillCounts::parse("vllm:prompt_tokens_total 5\n"), None);
        let fresh = PrefillCounts::parse("peregrine:prefix_cache_hits_total 0\n").unwrap();
        assert_eq!(fresh.prompt_tokens, 0.0);
    }

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(
            shell_quote("http://127.0.0.1:8000"),
            "http://127.0.0.1:8000"
        );
        assert_eq!(shell_quote("my data.jsonl"), "'my data.jsonl'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
