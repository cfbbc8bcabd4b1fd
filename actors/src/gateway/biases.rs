//! OpenAI's `logit_bias` and vLLM's `min_tokens`, read into the sampling parameters: each
//! bias names a token of the vocabulary by its id (a JSON object's keys are strings) and lies
//! in [-100, 100]; `min_tokens` holds back the end-of-sequence ids (unless `ignore_eos`) and
//! the request's `stop_token_ids` until that many tokens are generated, and may not exceed
//! `max_tokens`. Every error is a 400 naming the field.

use std::collections::BTreeMap;

use super::errors::ApiError;

/// What the served vocabulary is, for the checks.
#[derive(Clone, Debug)]
pub struct Vocabulary {
    /// Ids below this are tokens.
    pub size: usize,
    /// The ids that end a sequence.
    pub eos_token_ids: Vec<u32>,
}

/// `logit_bias` as `(token, bias)` pairs in ascending id order.
pub fn logit_bias(
    given: Option<&BTreeMap<String, f64>>,
    vocabulary: &Vocabulary,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(given) = given else {
        return Ok(Vec::new());
    };
    let mut biases: Vec<(u32, f32)> = Vec::with_capacity(given.len());
    for (key, &bias) in given {
        let id = key
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocabulary.size)
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!(
                        "`logit_bias` key \"{key}\" is not a token id of the vocabulary \
                         (0 to {})",
                        vocabulary.size.saturating_sub(1)
                    ),
                )
            })?;
        if !(-100.0..=100.0).contains(&bias) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` of token {id} is {bias}: each bias must be in [-100, 100]"),
            ));
        }
        biases.push((id, bias as f32));
    }
    biases.sort_by_key(|&(id, _)| id);
    if let Some(pair) = biases.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("`logit_bias` names token {} twice", pair[0].0),
        ));
    }
    Ok(biases)
}

/// `min_tokens` (0 when absent) and the ids it holds back, checked against the request's
/// `max_tokens`.
pub fn min_tokens(
    given: Option<i64>,
    max_tokens: usize,
    stop_token_ids: &[u32],
    ignore_eos: bool,
    vocabulary: &Vocabulary,
) -> Result<(usize, Vec<u32>), ApiError> {
    let Some(given) = given else {
        return Ok((0, Vec::new()));
    };
    let count = usize::try_from(given).map_err(|_| {
        ApiError::invalid(
            "min_tokens",
            format!("`min_tokens` must be at least 0, got {given}"),
        )
    })?;
    if count > max_tokens {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("`min_tokens` ({count}) must not exceed `max_tokens` ({max_tokens})"),
        ));
    }
    let mut held: Vec<u32> = stop_token_ids.to_vec();
    if !ignore_eos {
        held.extend(&vocabulary.eos_token_ids);
    }
    held.sort_unstable();
    held.dedup();
    Ok((count, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: fn() -> Vocabulary = || Vocabulary {
        size: 100,
        eos_token_ids: vec![2],
    };

    fn biases(pairs: &[(&str, f64)]) -> Result<Vec<(u32, f32)>, ApiError> {
        let map = pairs.iter().map(|&(k, v)| (k.to_owned(), v)).collect();
        logit_bias(Some(&map), &VOCAB())
    }

    #[test]
    fn biases_are_read_sorted_and_checked() {
        assert_eq!(
            biases(&[("7", -100.0), ("10", 2.5), ("99", 100.0)]).unwrap(),
            vec![(7, -100.0), (10, 2.5), (99, 100.0)]
        );
        for (bad, says) in [
            (vec![("100", 1.0)], "not a token id"),
            (vec![("-1", 1.0)], "not a token id"),
            (vec![("x", 1.0)], "not a token id"),
            (vec![("3", 100.5)], "[-100, 100]"),
            (vec![("3", -101.0)], "[-100, 100]"),
            (vec![("3", 1.0), ("03", 2.0)], "twice"),
        ] {
            let err = biases(&bad).unwrap_err();
            assert_eq!(err.param(), Some("logit_bias"), "{bad:?}");
            assert!(err.to_string().contains(says), "{bad:?}: {err}");
        }
        assert_eq!(logit_bias(None, &VOCAB()).unwrap(), vec![]);
    }

    #[test]
    fn min_tokens_holds_back_eos_and_stop_ids_within_max_tokens() {
        assert_eq!(
            min_tokens(None, 10, &[5], false, &VOCAB()).unwrap(),
            (0, vec![])
        );
        assert_eq!(
            min_tokens(Some(3), 10, &[5, 2], false, &VOCAB()).unwrap(),
            (3, vec![2, 5])
        );
        assert_eq!(
            min_tokens(Some(10), 10, &[], true, &VOCAB()).unwrap(),
            (10, vec![])
        );
        for bad in [-1, 11] {
            let err = min_tokens(Some(bad), 10, &[], false, &VOCAB()).unwrap_err();
            assert_eq!(err.param(), Some("min_tokens"));
        }
    }
}
