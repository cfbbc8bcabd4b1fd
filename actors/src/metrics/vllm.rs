//! The engine's series under vLLM's names, beside the `peregrine:*` ones, so that what reads
//! a vLLM server's `/metrics` reads Peregrine's unchanged: the Gateway API inference
//! extension's model-server protocol (`vllm:num_requests_waiting`,
//! `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`), which
//! llm-d's router follows, and the counters and histograms of vLLM's Grafana dashboard and
//! production-stack router. Each vLLM series is a copy of its Peregrine series at render
//! time (same type, value and labels), with the `model_name` label vLLM puts on every series
//! (the dashboard selects by it); [`VLLM_NAMES`] is the one table of the correspondence.

use super::{
    E2E_REQUEST_LATENCY, GENERATION_TOKENS, INTER_TOKEN_LATENCY, KV_CACHE_USAGE_PERC,
    NUM_PREEMPTIONS, NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES, PROMPT_TOKENS, REQUEST_QUEUE_TIME, REQUEST_SUCCESS,
    SPEC_ACCEPTED_PER_POS, SPEC_NUM_ACCEPTED_TOKENS, SPEC_NUM_DRAFTS, SPEC_NUM_DRAFT_TOKENS,
    TIME_TO_FIRST_TOKEN,
};

/// Every Peregrine series exported under vLLM's names too: the Peregrine name and the vLLM
/// names that copy it (a counter's names as exposed, with `_total`). vLLM's meaning is the
/// Peregrine series' own: requests running (holding KV blocks) and waiting, the fraction
/// of KV blocks in use (0..1; `gpu_cache_usage_perc` is its name before vLLM 0.10), prompt
/// tokens looked up in and found in the prefix cache, tokens, finished requests by
/// `finished_reason`, preemptions, the latency histograms in seconds (inter-token latency
/// also under the older `time_per_output_token_seconds`), and speculative decoding's counts.
pub const VLLM_NAMES: &[(&str, &[&str])] = &[
    (NUM_REQUESTS_RUNNING, &["vllm:num_requests_running"]),
    (NUM_REQUESTS_WAITING, &["vllm:num_requests_waiting"]),
    (
        KV_CACHE_USAGE_PERC,
        &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    ),
    (PREFIX_CACHE_QUERIES, &["vllm:prefix_cache_queries_total"]),
    (PREFIX_CACHE_HITS, &["vllm:prefix_cache_hits_total"]),
    (PROMPT_TOKENS, &["vllm:prompt_tokens_total"]),
    (GENERATION_TOKENS, &["vllm:generation_tokens_total"]),
    (REQUEST_SUCCESS, &["vllm:request_success_total"]),
    (NUM_PREEMPTIONS, &["vllm:num_preemptions_total"]),
    (TIME_TO_FIRST_TOKEN, &["vllm:time_to_first_token_seconds"]),
    (
        INTER_TOKEN_LATENCY,
        &[
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
        ],
    ),
    (E2E_REQUEST_LATENCY, &["vllm:e2e_request_latency_seconds"]),
    (REQUEST_QUEUE_TIME, &["vllm:request_queue_time_seconds"]),
    (SPEC_NUM_DRAFTS, &["vllm:spec_decode_num_drafts_total"]),
    (
        SPEC_NUM_DRAFT_TOKENS,
        &["vllm:spec_decode_num_draft_tokens_total"],
    ),
    (
        SPEC_NUM_ACCEPTED_TOKENS,
        &["vllm:spec_decode_num_accepted_tokens_total"],
    ),
    (
        SPEC_ACCEPTED_PER_POS,
        &["vllm:spec_decode_num_accepted_tokens_per_pos_total"],
    ),
];

/// vLLM's gauge of the cache's configuration: 1, its labels the configuration.
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

/// What `vllm:cache_config_info` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfigInfo {
    /// Tokens a KV block holds.
    pub block_size: usize,
    /// KV blocks of the pool (vLLM's `num_gpu_blocks`, on the CPU too).
    pub num_blocks: u64,
}

/// `rendered` (the Prometheus exporter's text) followed by the vLLM copies of the series in
/// [`VLLM_NAMES`], each with `model_name` set to `model_name`, and `vllm:cache_config_info`.
/// Each vLLM family's lines are kept together, in the order of the Peregrine family's.
pub fn with_vllm_names(rendered: &str, model_name: &str, cache: CacheConfigInfo) -> String {
    let label = format!("model_name=\"{}\"", escape_label(model_name));
    let mut families: Vec<(&str, Vec<String>)> = Vec::new();
    for line in rendered.lines() {
        let Some((name, vllm_names)) = family_of(line) else {
            continue;
        };
        for &vllm in vllm_names {
            let copy = renamed(line, name, vllm, &label);
            match families.iter_mut().find(|(family, _)| *family == vllm) {
                Some((_, lines)) => lines.push(copy),
                None => families.push((vllm, vec![copy])),
            }
        }
    }
    let mut out = String::with_capacity(2 * rendered.len() + 256);
    out.push_str(rendered);
    if !rendered.is_empty() && !rendered.ends_with('\n') {
        out.push('\n');
    }
    for (_, lines) in families {
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "# HELP {CACHE_CONFIG_INFO} Information of the KV cache's configuration.\n\
         # TYPE {CACHE_CONFIG_INFO} gauge\n\
         {CACHE_CONFIG_INFO}{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1\n",
        cache.block_size, cache.num_blocks
    ));
    out
}

/// The Peregrine family a line of the exposition belongs to (a `# HELP` or `# TYPE` line,
/// or a sample, a histogram's `_bucket`, `_sum` and `_count` included) and its vLLM names,
/// where the table has it.
fn family_of(line: &str) -> Option<(&'static str, &'static [&'static str])> {
    let name = match line.strip_prefix('#') {
        Some(comment) => {
            let mut words = comment.split_whitespace();
            match words.next() {
                Some("HELP" | "TYPE") => words.next()?,
                _ => return None,
            }
        }
        None => line.split(['{', ' ']).next()?,
    };
    VLLM_NAMES.iter().copied().find(|&(family, _)| {
        name.strip_prefix(family)
            .is_some_and(|suffix| ["", "_bucket", "_sum", "_count"].contains(&suffix))
    })
}

/// `line` of the family `name` as a line of `vllm`: the name replaced, and on a sample the
/// `model_name` label (`label`) first among its labels.
fn renamed(line: &str, name: &str, vllm: &str, label: &str) -> String {
    if let Some(comment) = line.strip_prefix("# ") {
        // "HELP name ..." or "TYPE name ...": the name is the second word.
        let (kind, rest) = comment.split_once(' ').unwrap_or((comment, ""));
        let rest = rest.strip_prefix(name).unwrap_or(rest);
        return format!("# {kind} {vllm}{rest}");
    }
    let rest = &line[name.len()..];
    // The histogram suffix (if any), then the labels or the value.
    let suffix_len = rest.find(['{', ' ']).unwrap_or(rest.len());
    let (suffix, rest) = rest.split_at(suffix_len);
    match rest.strip_prefix('{') {
        Some(labels) => format!("{vllm}{suffix}{{{label},{labels}"),
        None => format!("{vllm}{suffix}{{{label}}}{rest}"),
    }
}

/// A label value escaped as the exposition format asks: backslash, quote and newline.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{FinishReason, KvUsage};
    use crate::metrics::{
        record_finish, record_kv, record_preemption, record_queue_time, record_queues,
        record_token, record_verification, HISTOGRAMS, LATENCY_BUCKETS,
    };
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use std::collections::HashMap;
    use std::time::Duration;

    /// The exposition of a recorder that saw one of everything the table maps.
    fn rendered() -> String {
        let mut builder = PrometheusBuilder::new();
        for name in HISTOGRAMS {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.into()), &LATENCY_BUCKETS)
                .unwrap();
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            record_queues(3, 2);
            let usage = KvUsage {
                num_blocks: 100,
                used_blocks: 25,
                max_block_id_in_use: Some(30),
                prefix_queries: 64,
                prefix_hits: 48,
                cached_blocks: 40,
                ..KvUsage::default()
            };
            record_kv(&usage, &mut KvUsage::default());
            record_finish(FinishReason::Length, 17, Duration::from_millis(900));
            record_finish(FinishReason::Stop, 5, Duration::from_millis(300));
            record_token(true, Duration::from_millis(40));
            record_token(false, Duration::from_millis(8));
            record_queue_time(Duration::from_millis(3));
            record_preemption();
            record_verification(3, 2);
        });
        handle.render()
    }

    /// Every sample as {"name{labels}": value} and every family's type.
    fn parse(text: &str) -> (HashMap<String, f64>, HashMap<String, String>) {
        let (mut samples, mut types) = (HashMap::new(), HashMap::new());
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    types.insert(name.to_string(), kind.to_string()).is_none(),
                    "{name} typed twice"
                );
            } else if !line.starts_with('#') && !line.is_empty() {
                let (series, value) = line.rsplit_once(' ').unwrap();
                samples.insert(series.to_string(), value.parse().unwrap());
            }
        }
        (samples, types)
    }

    /// The series `series` of the Peregrine family `family` as the vLLM family `vllm` names
    /// it, with the model's label first.
    fn as_vllm(series: &str, family: &str, vllm: &str) -> String {
        let rest = &series[family.len()..];
        match rest.split_once('{') {
            Some((suffix, labels)) => format!("{vllm}{suffix}{{model_name=\"m\\\"1\",{labels}"),
            None => format!("{vllm}{rest}{{model_name=\"m\\\"1\"}}"),
        }
    }

    #[test]
    fn every_vllm_name_copies_its_series_type_values_and_labels() {
        let rendered = rendered();
        let cache = CacheConfigInfo {
            block_size: 16,
            num_blocks: 4096,
        };
        let text = with_vllm_names(&rendered, "m\"1", cache);
        let (samples, types) = parse(&text);
        for &(family, vllm_names) in VLLM_NAMES {
            let kind = types
                .get(family)
                .unwrap_or_else(|| panic!("the recorder did not export {family}"));
            let own: Vec<(&String, &f64)> = samples
                .iter()
                .filter(|(series, _)| family_of(series).is_some_and(|(f, _)| f == family))
                .collect();
            assert!(!own.is_empty(), "{family} has no samples");
            for &vllm in vllm_names {
                assert_eq!(types.get(vllm), Some(kind), "the type of {vllm}");
                for (series, value) in &own {
                    let copy = as_vllm(series, family, vllm);
                    assert_eq!(samples.get(&copy), Some(*value), "{copy} (from {series})");
                }
                let copies = samples.keys().filter(|s| {
                    s.strip_prefix(vllm).is_some_and(|r| {
                        ["{", "_bucket{", "_sum{", "_count{"]
                            .iter()
                            .any(|p| r.starts_with(p))
                    })
                });
                assert_eq!(copies.count(), own.len(), "{vllm}: stray series");
            }
        }
        // The gauges the inference extension's endpoint picker reads.
        assert_eq!(
            samples["vllm:num_requests_waiting{model_name=\"m\\\"1\"}"],
            2.0
        );
        assert_eq!(
            samples["vllm:kv_cache_usage_perc{model_name=\"m\\\"1\"}"],
            0.25
        );
        assert_eq!(
            samples["vllm:request_success_total{model_name=\"m\\\"1\",finished_reason=\"length\"}"],
            1.0
        );
        assert_eq!(types[CACHE_CONFIG_INFO], "gauge");
        assert_eq!(
            samples["vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4096\"}"],
            1.0
        );
        // The Peregrine series are untouched, first.
        assert!(text.starts_with(&rendered));
    }

    #[test]
    fn each_vllm_family_keeps_its_lines_together() {
        let text = with_vllm_names(
            &rendered(),
            "m",
            CacheConfigInfo {
                block_size: 16,
                num_blocks: 1,
            },
        );
        let mut seen: Vec<&str> = Vec::new();
        for line in text.lines().filter(|l| l.starts_with("vllm:")) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            match seen.iter().position(|&f| f == family) {
                Some(at) => assert_eq!(at, seen.len() - 1, "{family} is split"),
                None => seen.push(family),
            }
        }
    }
}
