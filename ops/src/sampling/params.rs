//! Sampling parameters of one request, with vLLM's defaults and validation ranges.

use serde::{Deserialize, Serialize};

/// Temperatures below this are greedy, as in vLLM (`_SAMPLING_EPS`).
const GREEDY_BELOW: f32 = 1e-5;

/// How the next token of one request is chosen. Fields left out when deserializing take
/// vLLM's defaults (see [`Default`]); call [`SamplingParams::validate`] before use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Divides the logits; 0 (anything below 1e-5) means greedy argmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 or -1 turns it off.
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1.0 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0.0 turns it off.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of prompt and output tokens; 1.0 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token present in the output; 0.0 is off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output; 0.0 is off.
    pub frequency_penalty: f32,
    /// Seeds the request's RNG; `None` seeds it from OS entropy.
    pub seed: Option<u64>,
    /// Added to the logits of these tokens before the penalties (OpenAI's `logit_bias`):
    /// `(token, bias)` with each bias in [-100, 100]; ids past the vocabulary are ignored.
    pub logit_bias: Vec<(u32, f32)>,
    /// The ids in `min_tokens_stop_ids` are not sampled before this many tokens have been
    /// generated (vLLM's `min_tokens`); 0 is off.
    pub min_tokens: usize,
    /// The ids `min_tokens` holds back: the end-of-sequence ids (unless `ignore_eos`) and
    /// the request's `stop_token_ids`.
    pub min_tokens_stop_ids: Vec<u32>,
}

impl Default for SamplingParams {
    /// vLLM's defaults: temperature 1.0, every filter and penalty off, no seed.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
            min_tokens: 0,
            min_tokens_stop_ids: Vec::new(),
        }
    }
}

/// An invalid sampling parameter; the message names the field, its value and the valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A parameter outside its valid range.
    #[error("invalid sampling parameter `{field}` = {value}: {expected}")]
    Invalid {
        /// The parameter's name, as in the request.
        field: &'static str,
        /// The value given.
        value: String,
        /// The valid range, in words.
        expected: &'static str,
    },
    /// The OS could not provide entropy to seed an unseeded request's RNG.
    #[error("cannot seed the sampling RNG from OS entropy: {0}")]
    Entropy(String),
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, everything else at its default.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether the token is the argmax (temperature below 1e-5, as in vLLM).
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
    }

    /// Whether a penalty changes the logits before sampling (`apply_penalties` is a no-op
    /// otherwise).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether `min_tokens` holds its stop ids back after `generated` tokens.
    pub fn holds_back_stops(&self, generated: usize) -> bool {
        generated < self.min_tokens && !self.min_tokens_stop_ids.is_empty()
    }

    /// Whether `logit_bias` or `min_tokens` changes the logits of the token after
    /// `generated` ones, or of any later one (`apply_biases` is a no-op otherwise): a
    /// request past its `min_tokens` without biases samples as if it had neither.
    pub fn biases_after(&self, generated: usize) -> bool {
        !self.logit_bias.is_empty() || self.holds_back_stops(generated)
    }

    /// Checks every field against vLLM's ranges; the error names the first bad field.
    pub fn validate(&self) -> Result<(), SamplingError> {
        check(
            "temperature",
            self.temperature,
            self.temperature >= 0.0,
            "must be a finite number >= 0",
        )?;
        check(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "must be in (0, 1]",
        )?;
        if self.top_k < -1 {
            return Err(SamplingError::Invalid {
                field: "top_k",
                value: self.top_k.to_string(),
                expected: "must be -1 or 0 (off) or >= 1",
            });
        }
        check(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "must be in [0, 1]",
        )?;
        check(
            "repetition_penalty",
            self.repetition_penalty,
            self.repetition_penalty > 0.0,
            "must be a finite number > 0",
        )?;
        check(
            "presence_penalty",
            self.presence_penalty,
            (-2.0..=2.0).contains(&self.presence_penalty),
            "must be in [-2, 2]",
        )?;
        check(
            "frequency_penalty",
            self.frequency_penalty,
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "must be in [-2, 2]",
        )?;
        for &(_, bias) in &self.logit_bias {
            check(
                "logit_bias",
                bias,
                (-100.0..=100.0).contains(&bias),
                "each bias must be in [-100, 100]",
            )?;
        }
        Ok(())
    }
}

/// Fails with `expected` unless `value` is finite and `in_range`.
fn check(
    field: &'static str,
    value: f32,
    in_range: bool,
    expected: &'static str,
) -> Result<(), SamplingError> {
    if value.is_finite() && in_range {
        Ok(())
    } else {
        Err(SamplingError::Invalid {
            field,
            value: value.to_string(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_greedy_are_valid() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        assert_eq!(SamplingParams::greedy().validate(), Ok(()));
        assert!(SamplingParams::greedy().is_greedy());
        assert!(!SamplingParams::default().is_greedy());
    }

    #[test]
    fn boundary_values_are_valid() {
        let params = SamplingParams {
            temperature: 0.0,
            top_k: -1,
            top_p: 1.0,
            min_p: 1.0,
            repetition_penalty: 1e-3,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            seed: Some(7),
            logit_bias: vec![(0, -100.0), (5, 100.0)],
            min_tokens: 3,
            min_tokens_stop_ids: vec![2],
        };
        assert_eq!(params.validate(), Ok(()));
        let bad = SamplingParams {
            logit_bias: vec![(0, 100.5)],
            ..params
        };
        assert!(matches!(
            bad.validate(),
            Err(SamplingError::Invalid {
                field: "logit_bias",
                ..
            })
        ));
    }

    #[test]
    fn validation_errors_name_the_field_and_value() {
        type Case = (&'static str, &'static str, fn(&mut SamplingParams));
        let cases: [Case; 11] = [
            ("temperature", "-0.5", |p| p.temperature = -0.5),
            ("temperature", "inf", |p| p.temperature = f32::INFINITY),
            ("top_p", "0", |p| p.top_p = 0.0),
            ("top_p", "1.5", |p| p.top_p = 1.5),
            ("top_p", "NaN", |p| p.top_p = f32::NAN),
            ("top_k", "-2", |p| p.top_k = -2),
            ("min_p", "1.25", |p| p.min_p = 1.25),
            ("min_p", "-0.25", |p| p.min_p = -0.25),
            ("repetition_penalty", "0", |p| p.repetition_penalty = 0.0),
            ("presence_penalty", "2.5", |p| p.presence_penalty = 2.5),
            ("frequency_penalty", "-3", |p| p.frequency_penalty = -3.0),
        ];
        for (field, value, break_it) in cases {
            let mut params = SamplingParams::default();
            break_it(&mut params);
            let err = params.validate().expect_err(field);
            let message = err.to_string();
            assert!(
                message.contains(&format!("`{field}` = {value}")),
                "{message:?} should name {field} = {value}"
            );
        }
    }

    #[test]
    fn missing_fields_take_defaults_when_deserialized() {
        let params: SamplingParams =
            serde_json::from_str(r#"{"temperature": 0.25, "top_k": 12, "seed": 99}"#).unwrap();
        assert_eq!(
            params,
            SamplingParams {
                temperature: 0.25,
                top_k: 12,
                seed: Some(99),
                ..Default::default()
            }
        );
        let back: SamplingParams =
            serde_json::from_str(&serde_json::to_string(&params).unwrap()).unwrap();
        assert_eq!(back, params);
    }
}
