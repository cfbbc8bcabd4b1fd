//! Sampling parameters that apply when a request leaves them out.

use serde::Deserialize;

/// Server-wide defaults for the sampling parameters of a request; `None` leaves the
/// engine's own default (vLLM's: temperature 1, top_p 1, top_k off, ...).
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SamplingDefaults {
    /// Softmax temperature; 0 means greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens; -1 or 0 keeps all.
    pub top_k: Option<i32>,
    /// Drop tokens less likely than min_p times the most likely one.
    pub min_p: Option<f32>,
    /// Penalises tokens already in the prompt or output; 1 is off.
    pub repetition_penalty: Option<f32>,
    /// Subtracted from the logit of every token already generated.
    pub presence_penalty: Option<f32>,
    /// Subtracted per occurrence of a token already generated.
    pub frequency_penalty: Option<f32>,
    /// The most tokens to generate.
    pub max_tokens: Option<u64>,
}

impl SamplingDefaults {
    /// Checks every set field against vLLM's ranges; the error is the field and why.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        let SamplingDefaults {
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            max_tokens,
        } = *self;
        check("temperature", temperature, |v| v >= 0.0, "at least 0")?;
        check("top_p", top_p, |v| v > 0.0 && v <= 1.0, "in (0, 1]")?;
        check("min_p", min_p, |v| (0.0..=1.0).contains(&v), "in [0, 1]")?;
        check(
            "repetition_penalty",
            repetition_penalty,
            |v| v > 0.0,
            "more than 0",
        )?;
        let penalty = |v: f32| (-2.0..=2.0).contains(&v);
        check("presence_penalty", presence_penalty, penalty, "in [-2, 2]")?;
        check(
            "frequency_penalty",
            frequency_penalty,
            penalty,
            "in [-2, 2]",
        )?;
        if let Some(k) = top_k.filter(|&k| k < -1) {
            return Err((
                "top_k",
                format!("must be -1 or 0 (all) or at least 1, not {k}"),
            ));
        }
        if max_tokens == Some(0) {
            return Err(("max_tokens", "must be at least 1, not 0".to_string()));
        }
        Ok(())
    }
}

/// Checks a float field that is set: finite and within `rule`.
fn check(
    field: &'static str,
    value: Option<f32>,
    ok: impl Fn(f32) -> bool,
    rule: &str,
) -> Result<(), (&'static str, String)> {
    match value {
        Some(v) if !v.is_finite() || !ok(v) => Err((field, format!("must be {rule}, not {v}"))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_vllm_ranges_and_refuses_the_rest() {
        let ok = SamplingDefaults {
            temperature: Some(0.0),
            top_p: Some(1.0),
            top_k: Some(-1),
            min_p: Some(0.0),
            repetition_penalty: Some(1.0),
            presence_penalty: Some(-2.0),
            frequency_penalty: Some(2.0),
            max_tokens: Some(1),
        };
        assert_eq!(ok.validate(), Ok(()));
        let bad = [
            (
                SamplingDefaults {
                    temperature: Some(-0.1),
                    ..ok.clone()
                },
                "temperature",
            ),
            (
                SamplingDefaults {
                    temperature: Some(f32::NAN),
                    ..ok.clone()
                },
                "temperature",
            ),
            (
                SamplingDefaults {
                    top_p: Some(0.0),
                    ..ok.clone()
                },
                "top_p",
            ),
            (
                SamplingDefaults {
                    top_k: Some(-2),
                    ..ok.clone()
                },
                "top_k",
            ),
            (
                SamplingDefaults {
                    min_p: Some(1.5),
                    ..ok.clone()
                },
                "min_p",
            ),
            (
                SamplingDefaults {
                    repetition_penalty: Some(0.0),
                    ..ok.clone()
                },
                "repetition_penalty",
            ),
            (
                SamplingDefaults {
                    presence_penalty: Some(2.5),
                    ..ok.clone()
                },
                "presence_penalty",
            ),
            (
                SamplingDefaults {
                    frequency_penalty: Some(f32::INFINITY),
                    ..ok.clone()
                },
                "frequency_penalty",
            ),
            (
                SamplingDefaults {
                    max_tokens: Some(0),
                    ..ok.clone()
                },
                "max_tokens",
            ),
        ];
        for (defaults, field) in bad {
            assert_eq!(defaults.validate().map_err(|e| e.0), Err(field));
        }
    }
}
