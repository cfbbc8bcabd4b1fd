//! Percentiles and the benchmark's summary numbers.

/// What one successful request measured. Times are in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMetrics {
    /// Prompt tokens (the server's usage count, else the local estimate).
    pub input_tokens: usize,
    /// Generated tokens (the server's usage count, else the number of token-carrying
    /// chunks).
    pub output_tokens: usize,
    /// Time to first token: from sending to the first token-carrying chunk.
    pub ttft: f64,
    /// End-to-end latency: from sending to `data: [DONE]`.
    pub e2e: f64,
    /// The gaps between consecutive token-carrying chunks after the first.
    pub itl: Vec<f64>,
    /// Why generation stopped (`length`, `stop`, `tool_calls`, ...), if the stream said.
    pub finish_reason: Option<String>,
}

impl RequestMetrics {
    /// Time per output token after the first; `None` for fewer than two tokens.
    pub fn tpot(&self) -> Option<f64> {
        (self.output_tokens > 1).then(|| (self.e2e - self.ttft) / (self.output_tokens - 1) as f64)
    }
}

/// The `p`-th percentile (0 to 100) of `values`, interpolating linearly between the
/// closest ranks as numpy's default does; 0 for no values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    let rank = p.clamp(0.0, 100.0) / 100.0 * last as f64;
    let low = rank.floor() as usize;
    let high = rank.ceil() as usize;
    sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
}

/// Mean, median, p90 and p99 of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Distribution {
    /// The mean.
    pub mean: f64,
    /// The 50th percentile.
    pub median: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Distribution {
    /// Summarises values given in seconds; all zero for no values.
    pub fn from_seconds(values: &[f64]) -> Self {
        let ms: Vec<f64> = values.iter().map(|s| s * 1000.0).collect();
        let mean = if ms.is_empty() {
            0.0
        } else {
            ms.iter().sum::<f64>() / ms.len() as f64
        };
        Self {
            mean,
            median: percentile(&ms, 50.0),
            p90: percentile(&ms, 90.0),
            p99: percentile(&ms, 99.0),
        }
    }
}

/// The benchmark's totals, rates and latency distributions.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Requests that finished with `data: [DONE]`.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Wall time of the whole run, in seconds.
    pub duration: f64,
    /// Prompt tokens of the successful requests.
    pub total_input_tokens: usize,
    /// Generated tokens of the successful requests.
    pub total_output_tokens: usize,
    /// Successful requests per second.
    pub request_throughput: f64,
    /// Generated tokens per second.
    pub output_throughput: f64,
    /// Prompt and generated tokens per second.
    pub total_token_throughput: f64,
    /// Time to first token.
    pub ttft: Distribution,
    /// Time per output token after the first.
    pub tpot: Distribution,
    /// Inter-token latency, over every gap of every request.
    pub itl: Distribution,
    /// End-to-end request latency.
    pub e2e: Distribution,
}

impl Summary {
    /// Summarises the successful requests of a run that took `duration` seconds.
    pub fn new(successes: &[&RequestMetrics], failed: usize, duration: f64) -> Self {
        let total_input_tokens = successes.iter().map(|m| m.input_tokens).sum();
        let total_output_tokens = successes.iter().map(|m| m.output_tokens).sum();
        let rate = |n: usize| {
            if duration > 0.0 {
                n as f64 / duration
            } else {
                0.0
            }
        };
        let ttfts: Vec<f64> = successes.iter().map(|m| m.ttft).collect();
        let tpots: Vec<f64> = successes.iter().filter_map(|m| m.tpot()).collect();
        let itls: Vec<f64> = successes
            .iter()
            .flat_map(|m| m.itl.iter().copied())
            .collect();
        let e2es: Vec<f64> = successes.iter().map(|m| m.e2e).collect();
        Self {
            completed: successes.len(),
            failed,
            duration,
            total_input_tokens,
            total_output_tokens,
            request_throughput: rate(successes.len()),
            output_throughput: rate(total_output_tokens),
            total_token_throughput: rate(total_input_tokens + total_output_tokens),
            ttft: Distribution::from_seconds(&ttfts),
            tpot: Distribution::from_seconds(&tpots),
            itl: Distribution::from_seconds(&itls),
            e2e: Distribution::from_seconds(&e2es),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_of_known_arrays() {
        // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4
        let v = [4.0, 1.0, 3.0, 2.0];
        for (p, want) in [
            (0.0, 1.0),
            (50.0, 2.5),
            (90.0, 3.7),
            (99.0, 3.97),
            (100.0, 4.0),
        ] {
            assert!(
                close(percentile(&v, p), want),
                "p{p}: {}",
                percentile(&v, p)
            );
        }
        // 1..=100: p50 = 50.5, p90 = 90.1, p99 = 99.01
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!(close(percentile(&hundred, 50.0), 50.5));
        assert!(close(percentile(&hundred, 90.0), 90.1));
        assert!(close(percentile(&hundred, 99.0), 99.01));
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn summary_of_two_requests() {
        let a = RequestMetrics {
            input_tokens: 10,
            output_tokens: 5,
            ttft: 0.1,
            e2e: 0.5,
            itl: vec![0.1; 4],
            finish_reason: Some("length".into()),
        };
        let b = RequestMetrics {
            input_tokens: 20,
            output_tokens: 1,
            ttft: 0.3,
            e2e: 0.3,
            itl: vec![],
            finish_reason: None,
        };
        let s = Summary::new(&[&a, &b], 1, 2.0);
        assert_eq!(
            (
                s.completed,
                s.failed,
                s.total_input_tokens,
                s.total_output_tokens
            ),
            (2, 1, 30, 6)
        );
        assert!(close(s.request_throughput, 1.0));
        assert!(close(s.output_throughput, 3.0));
        assert!(close(s.total_token_throughput, 18.0));
        assert!(close(s.ttft.mean, 200.0));
        // Only `a` has a TPOT: (0.5 - 0.1) / 4 = 100 ms.
        assert!(close(s.tpot.median, 100.0));
        assert!(close(s.itl.p99, 100.0));
        assert_eq!(
            Summary::new(&[], 3, 0.0).ttft,
            Distribution::from_seconds(&[])
        );
    }
}
