//! The reduced draft vocabulary: `d2t` offsets mapping draft ids to target ids.

use super::Eagle3Error;

/// Draft id → target id, resolved from `d2t` (`target = draft + d2t[draft]`) and checked
/// against the target vocabulary once, at load.
#[derive(Clone, Debug)]
pub struct DraftVocab {
    to_target: Vec<u32>,
}

impl DraftVocab {
    /// Resolves the offsets of `d2t`; every mapped id must lie in `0..target_vocab`, and
    /// no two draft ids may map to the same one (a sampled draft's distribution is over
    /// target ids).
    pub fn from_d2t(d2t: &[i64], target_vocab: usize) -> Result<DraftVocab, Eagle3Error> {
        let to_target: Vec<u32> = d2t
            .iter()
            .enumerate()
            .map(|(index, &offset)| {
                (index as i64)
                    .checked_add(offset)
                    .filter(|t| (0..target_vocab as i64).contains(t))
                    .map(|t| t as u32)
                    .ok_or(Eagle3Error::D2t {
                        index,
                        offset,
                        vocab: target_vocab,
                    })
            })
            .collect::<Result<_, _>>()?;
        let mut first = vec![None; target_vocab];
        for (draft, &target) in to_target.iter().enumerate() {
            if let Some(earlier) = first[target as usize].replace(draft) {
                return Err(Eagle3Error::D2tRepeats {
                    first: earlier,
                    second: draft,
                    target,
                });
            }
        }
        Ok(DraftVocab { to_target })
    }

    /// Draft vocabulary size.
    pub fn len(&self) -> usize {
        self.to_target.len()
    }

    /// Whether the draft vocabulary is empty (never, for a loaded head).
    pub fn is_empty(&self) -> bool {
        self.to_target.is_empty()
    }

    /// The target id of draft id `draft`.
    pub fn target(&self, draft: usize) -> u32 {
        self.to_target[draft]
    }

    /// The greedy draft of each row of `logits` (`[rows, len()]`): the first largest
    /// draft logit, as a target id.
    pub fn greedy(&self, logits: &[f32]) -> Vec<u32> {
        logits
            .chunks(self.len())
            .map(|row| {
                let mut best = 0;
                for (i, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = i;
                    }
                }
                self.target(best)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_offsets_and_refuses_ids_outside_the_target_vocabulary() {
        let v = DraftVocab::from_d2t(&[0, 2, 5, 5], 10).unwrap();
        assert_eq!(
            (0..4).map(|i| v.target(i)).collect::<Vec<_>>(),
            [0, 3, 7, 8]
        );
        assert_eq!(v.greedy(&[0.0, 1.0, 3.0, 3.0, 9.0, 0.0, 0.0, 0.0]), [7, 0]);
        let e = DraftVocab::from_d2t(&[0, 9], 10).unwrap_err().to_string();
        assert!(e.contains("d2t[1] = 9"), "{e}");
        assert!(DraftVocab::from_d2t(&[-1], 10).is_err());
        let e = DraftVocab::from_d2t(&[0, 1, 0], 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("maps draft ids 1 and 2 both to target id 2"),
            "{e}"
        );
        assert!(DraftVocab::from_d2t(&[i64::MAX, 0], 10).is_err());
    }
}
