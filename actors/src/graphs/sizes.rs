//! The batch sizes graphs are captured for.

/// The largest batch size the default set captures (vLLM's `max_cudagraph_capture_size`):
/// larger batches run eagerly unless `cudagraph_sizes` lists larger sizes.
pub const MAX_DEFAULT_CAPTURE_SIZE: usize = 512;

/// Batch sizes with a captured graph: sorted, distinct, nonzero, never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSizes(Vec<usize>);

impl CaptureSizes {
    /// The default set: 1, 2, 4, 8 and every multiple of 8, up to `max_num_seqs` and
    /// [`MAX_DEFAULT_CAPTURE_SIZE`] (at least size 1).
    pub fn for_max_num_seqs(max_num_seqs: usize) -> CaptureSizes {
        let max = max_num_seqs.clamp(1, MAX_DEFAULT_CAPTURE_SIZE);
        let sizes = [1, 2, 4]
            .into_iter()
            .chain((8..=max).step_by(8))
            .filter(|&s| s <= max)
            .collect();
        CaptureSizes(sizes)
    }

    /// The sizes `list` names (`cudagraph_sizes`), sorted and deduplicated; refused when
    /// empty, when one is 0, or when one exceeds `max_num_seqs` (a batch never holds more
    /// sequences, so such a graph would never replay).
    pub fn from_list(list: &[usize], max_num_seqs: usize) -> Result<CaptureSizes, String> {
        if list.is_empty() {
            return Err("cudagraph_sizes must name at least one batch size".into());
        }
        if list.contains(&0) {
            return Err("cudagraph_sizes must not hold 0".into());
        }
        if let Some(&size) = list.iter().find(|&&s| s > max_num_seqs) {
            return Err(format!(
                "cudagraph_sizes holds {size}, past max_num_seqs {max_num_seqs}"
            ));
        }
        let mut sizes = list.to_vec();
        sizes.sort_unstable();
        sizes.dedup();
        Ok(CaptureSizes(sizes))
    }

    /// The sizes a configuration asks for: none with `enforce_eager`, `list` when given,
    /// else the default set for `max_num_seqs`.
    pub fn configured(
        enforce_eager: bool,
        list: Option<&[usize]>,
        max_num_seqs: usize,
    ) -> Result<Option<CaptureSizes>, String> {
        match (enforce_eager, list) {
            (true, _) => Ok(None),
            (false, Some(list)) => CaptureSizes::from_list(list, max_num_seqs).map(Some),
            (false, None) => Ok(Some(CaptureSizes::for_max_num_seqs(max_num_seqs))),
        }
    }

    /// The smallest captured size that holds `n` sequences, if any does.
    pub fn padded(&self, n: usize) -> Option<usize> {
        let at = self.0.partition_point(|&s| s < n);
        self.0.get(at).copied()
    }

    /// Every size times `factor`: the rows of steps of up to `factor` rows a sequence over
    /// as many sequences as each size.
    pub fn scaled(&self, factor: usize) -> CaptureSizes {
        let factor = factor.max(1);
        CaptureSizes(self.0.iter().map(|&s| s * factor).collect())
    }

    /// The sizes, ascending.
    pub fn sizes(&self) -> &[usize] {
        &self.0
    }

    /// The largest size.
    pub fn largest(&self) -> usize {
        self.0[self.0.len() - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_sizes_hold_as_many_sequences_of_that_many_rows() {
        let sizes = CaptureSizes::for_max_num_seqs(16).scaled(4);
        assert_eq!(sizes.sizes(), [4, 8, 16, 32, 64]);
        assert_eq!(sizes.padded(9), Some(16));
        assert_eq!(sizes.padded(65), None);
        assert_eq!(CaptureSizes::for_max_num_seqs(2).scaled(0).sizes(), [1, 2]);
    }

    #[test]
    fn the_default_set_doubles_to_8_then_steps_by_8() {
        let sizes = CaptureSizes::for_max_num_seqs(64);
        assert_eq!(sizes.sizes(), [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]);
        assert!(sizes.sizes().len() >= 11);
        assert_eq!(CaptureSizes::for_max_num_seqs(20).sizes(), [1, 2, 4, 8, 16]);
        assert_eq!(CaptureSizes::for_max_num_seqs(3).sizes(), [1, 2]);
        assert_eq!(CaptureSizes::for_max_num_seqs(1).sizes(), [1]);
        assert_eq!(CaptureSizes::for_max_num_seqs(100).largest(), 96);
        // A huge max_num_seqs captures no more than the default cap (nor 125 million sizes).
        let huge = CaptureSizes::for_max_num_seqs(1_000_000_000);
        assert_eq!(huge.largest(), MAX_DEFAULT_CAPTURE_SIZE);
        assert_eq!(huge.sizes().len(), 3 + MAX_DEFAULT_CAPTURE_SIZE / 8);
    }

    #[test]
    fn a_batch_pads_to_the_next_captured_size() {
        let sizes = CaptureSizes::for_max_num_seqs(64);
        assert_eq!(sizes.padded(1), Some(1));
        assert_eq!(sizes.padded(3), Some(4));
        assert_eq!(sizes.padded(9), Some(16));
        assert_eq!(sizes.padded(64), Some(64));
        assert_eq!(sizes.padded(65), None);
    }

    #[test]
    fn listed_sizes_are_sorted_and_bad_ones_refused_by_name() {
        let sizes = CaptureSizes::from_list(&[8, 1, 4, 8], 16).unwrap();
        assert_eq!(sizes.sizes(), [1, 4, 8]);
        for (list, want) in [
            (&[][..], "cudagraph_sizes must name at least one batch size"),
            (&[1, 0][..], "cudagraph_sizes must not hold 0"),
            (
                &[1, 32][..],
                "cudagraph_sizes holds 32, past max_num_seqs 16",
            ),
        ] {
            assert_eq!(CaptureSizes::from_list(list, 16).unwrap_err(), want);
        }
        assert_eq!(CaptureSizes::configured(true, Some(&[0]), 16), Ok(None));
        assert_eq!(
            CaptureSizes::configured(false, None, 2)
                .unwrap()
                .unwrap()
                .sizes(),
            [1, 2]
        );
    }
}
