//! The target features an EAGLE-3 head's step 0 reads: a request's rows waiting for it,
//! on the host (the CPU backend's) or as rows of the CUDA backend's feature ring, and one
//! step's rows of every request it runs.

use crate::messages::HiddenData;
use peregrine_models::eagle3::HeadInput;

/// A request's target features waiting for step 0, one row a position: values on the
/// host, or the rows of the feature ring the CUDA backend stored them into.
pub(super) enum Pending {
    /// `[rows, width]`.
    Host(Vec<f32>),
    /// Ring row numbers, ascending.
    Ring(Vec<u64>),
}

impl Default for Pending {
    fn default() -> Pending {
        Pending::Host(Vec::new())
    }
}

impl Pending {
    /// The rows waiting, for rows of `width` values.
    pub(super) fn rows(&self, width: usize) -> usize {
        match self {
            Pending::Host(values) => values.len() / width,
            Pending::Ring(ids) => ids.len(),
        }
    }

    /// Keeps the first `rows` rows.
    pub(super) fn truncate(&mut self, rows: usize, width: usize) {
        match self {
            Pending::Host(values) => values.truncate(rows * width),
            Pending::Ring(ids) => ids.truncate(rows),
        }
    }

    /// Appends `data`; false (nothing appended) where its rows are not whole rows of
    /// `width` or lie elsewhere than the rows waiting.
    pub(super) fn extend(&mut self, data: HiddenData, width: usize) -> bool {
        if self.rows(width) == 0 {
            *self = match data {
                HiddenData::Host(_) => Pending::Host(Vec::new()),
                HiddenData::Ring { .. } => Pending::Ring(Vec::new()),
            };
        }
        match (self, data) {
            (Pending::Host(values), HiddenData::Host(more)) if more.len() % width == 0 => {
                values.extend(more);
                true
            }
            (Pending::Ring(ids), HiddenData::Ring { first, rows }) => {
                ids.extend(first..first + rows as u64);
                true
            }
            _ => false,
        }
    }

    /// The oldest ring row waiting, if the rows are in a ring.
    pub(super) fn oldest_ring_row(&self) -> Option<u64> {
        match self {
            Pending::Ring(ids) => ids.first().copied(),
            Pending::Host(_) => None,
        }
    }
}

/// One step 0's features, of every request it runs, in order: all on the host or all in
/// the ring.
#[derive(Default)]
pub(super) struct StepFeatures {
    host: Vec<f32>,
    ring: Vec<u64>,
}

impl StepFeatures {
    pub(super) fn push(&mut self, pending: &Pending) {
        match pending {
            Pending::Host(values) => self.host.extend_from_slice(values),
            Pending::Ring(ids) => self.ring.extend_from_slice(ids),
        }
    }

    /// The head's input; an error where requests' rows lie in both places.
    pub(super) fn input(&self) -> anyhow::Result<HeadInput<'_>> {
        match (self.host.is_empty(), self.ring.is_empty()) {
            (_, true) => Ok(HeadInput::Aux(&self.host)),
            (true, false) => Ok(HeadInput::Ring(&self.ring)),
            (false, false) => anyhow::bail!("a step 0 over features on the host and in a ring"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_rows_wait_truncate_and_refuse_host_rows_among_them() {
        let mut p = Pending::default();
        assert!(p.extend(HiddenData::Ring { first: 70, rows: 4 }, 3));
        assert!(p.extend(HiddenData::Ring { first: 90, rows: 2 }, 3));
        assert_eq!((p.rows(3), p.oldest_ring_row()), (6, Some(70)));
        // Rows of rejected drafts go.
        p.truncate(5, 3);
        assert!(!p.extend(HiddenData::Host(vec![1.0; 3]), 3));
        let mut step = StepFeatures::default();
        step.push(&p);
        assert!(matches!(
            step.input().unwrap(),
            HeadInput::Ring(&[70, 71, 72, 73, 90])
        ));
        // Emptied, the request takes host rows, whole rows only.
        p.truncate(0, 3);
        assert!(p.extend(HiddenData::Host(vec![2.0; 6]), 3));
        assert!(!p.extend(HiddenData::Host(vec![2.0; 4]), 3));
        assert_eq!((p.rows(3), p.oldest_ring_row()), (2, None));
        step.push(&p);
        assert!(step.input().is_err(), "rows on the host and in a ring");
    }
}
