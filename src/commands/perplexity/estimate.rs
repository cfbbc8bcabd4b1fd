//! The running perplexity estimate: the negative log-likelihood of each scored token
//! (log-softmax in f64) summed with its square, as llama-perplexity sums them.

/// The scored tokens so far: their count, and the sums of their negative log-likelihoods
/// and of its square.
#[derive(Debug, Default)]
pub struct Estimate {
    count: usize,
    nll: f64,
    nll2: f64,
}

impl Estimate {
    /// Scores `target` against one row of logits.
    pub fn add(&mut self, logits: &[f32], target: u32) {
        let nll = -log_softmax(logits, target as usize);
        self.count += 1;
        self.nll += nll;
        self.nll2 += nll * nll;
    }

    /// How many tokens were scored.
    pub fn count(&self) -> usize {
        self.count
    }

    /// e to the mean negative log-likelihood.
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// llama-perplexity's standard error of the perplexity: the perplexity times the
    /// standard error of the mean negative log-likelihood (its variance over count - 1);
    /// `None` where that variance is not positive.
    pub fn standard_error(&self) -> Option<f64> {
        let n = self.count as f64;
        let mean = self.nll / n;
        let variance = self.nll2 / n - mean * mean;
        (variance > 0.0 && self.count > 1).then(|| (variance / (n - 1.0)).sqrt() * mean.exp())
    }
}

/// `ln softmax(logits)[target]`, computed in f64 from the largest logit.
fn log_softmax(logits: &[f32], target: usize) -> f64 {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    logits[target] as f64 - max - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_the_vocabulary_size() {
        let mut estimate = Estimate::default();
        estimate.add(&[3.0; 50], 7);
        estimate.add(&[-1.0; 50], 0);
        assert!((estimate.perplexity() - 50.0).abs() < 1e-9);
        assert_eq!(estimate.count(), 2);
        assert_eq!(estimate.standard_error(), None, "no variance");
    }

    #[test]
    fn the_standard_error_is_llama_perplexitys() {
        // Two tokens of probability 1/2 and 1/4: nll ln 2 and ln 4.
        let mut estimate = Estimate::default();
        estimate.add(&[0.0, 0.0], 1);
        estimate.add(&[1.0, 1.0, 1.0, 1.0], 2);
        let (a, b) = (2f64.ln(), 4f64.ln());
        let mean = (a + b) / 2.0;
        let variance = (a * a + b * b) / 2.0 - mean * mean;
        assert!((estimate.perplexity() - mean.exp()).abs() < 1e-12);
        let expected = variance.sqrt() * mean.exp(); // over count - 1 = 1
        assert!((estimate.standard_error().unwrap() - expected).abs() < 1e-12);
    }
}
