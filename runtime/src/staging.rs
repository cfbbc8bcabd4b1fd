//! Staged inputs of captured graphs, each with a declared batch axis.
//!
//! A captured graph bakes in the addresses of its inputs, so every input is allocated once,
//! at the largest batch the graphs are captured for; each step writes its batch into it and
//! the graph reads it through a view. An input declares its shape at that largest batch and
//! which axis is the batch: token ids `[N]`, multi-axis rotary positions `[3, N]` (batch on
//! axis 1), block tables `[N, max_blocks]`. One code path stages every layout (nothing
//! branches on it): the real entries along the batch axis, then padding up to the captured
//! size, either by repeating the last real entry or with a fill value (a slot mapping's
//! padded rows point at a scratch slot that no sequence owns, so that a padded row never
//! writes into a real request's KV). A view keeps the strides of the whole buffer: `[3, N]`
//! viewed at batch `n` is `[3, n]` whose rows are still `N` apart.

/// What the padded entries of a batch hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding<T> {
    /// A copy of the last real entry along the batch axis.
    RepeatLast,
    /// This value in every element.
    Fill(T),
}

/// A batch that cannot be staged, naming the input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StageError {
    #[error("staged input `{name}`: batch axis {axis} of a {rank}-dimensional shape")]
    Axis {
        name: &'static str,
        axis: usize,
        rank: usize,
    },
    #[error("staged input `{name}`: {given} values for a batch of {batch} in shape {shape:?}")]
    Values {
        name: &'static str,
        given: usize,
        batch: usize,
        shape: Vec<usize>,
    },
    #[error(
        "staged input `{name}`: {real} real entries padded to {padded}, past the {max} it \
         was allocated for (or fewer than the real ones)"
    )]
    Batch {
        name: &'static str,
        real: usize,
        padded: usize,
        max: usize,
    },
    #[error("staged input `{name}`: no real entry to repeat into the padding")]
    NothingToRepeat { name: &'static str },
}

/// One input, allocated at its largest batch.
#[derive(Debug)]
pub struct StagedInput<T> {
    name: &'static str,
    /// The shape at the largest batch.
    shape: Vec<usize>,
    batch_axis: usize,
    padding: Padding<T>,
    data: Vec<T>,
}

/// A batch's view of a staged input: its shape (the batch axis at the batch's size) and the
/// whole buffer's strides, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedView<'a, T> {
    data: &'a [T],
    shape: Vec<usize>,
    strides: Vec<usize>,
}

impl<T: Copy + Default> StagedInput<T> {
    /// An input of `shape` at the largest batch, with the batch on `batch_axis`.
    pub fn new(
        name: &'static str,
        shape: &[usize],
        batch_axis: usize,
        padding: Padding<T>,
    ) -> Result<StagedInput<T>, StageError> {
        if batch_axis >= shape.len() {
            return Err(StageError::Axis {
                name,
                axis: batch_axis,
                rank: shape.len(),
            });
        }
        Ok(StagedInput {
            name,
            shape: shape.to_vec(),
            batch_axis,
            padding,
            data: vec![T::default(); shape.iter().product()],
        })
    }

    /// The largest batch the input holds.
    pub fn max_batch(&self) -> usize {
        self.shape[self.batch_axis]
    }

    /// The whole buffer (what a graph's kernels address).
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// Elements before, and after, one step of the batch axis.
    fn outer_inner(&self) -> (usize, usize) {
        let outer = self.shape[..self.batch_axis].iter().product();
        let inner = self.shape[self.batch_axis + 1..].iter().product();
        (outer, inner)
    }

    /// Writes `real` (row-major, the input's shape with `real_batch` on the batch axis) and
    /// pads the batch axis up to `padded_batch`; returns the view of `padded_batch`. Entries
    /// past `padded_batch` keep what they held.
    pub fn stage(
        &mut self,
        real: &[T],
        real_batch: usize,
        padded_batch: usize,
    ) -> Result<StagedView<'_, T>, StageError> {
        let (name, max) = (self.name, self.max_batch());
        if real_batch > padded_batch || padded_batch > max {
            return Err(StageError::Batch {
                name,
                real: real_batch,
                padded: padded_batch,
                max,
            });
        }
        let (outer, inner) = self.outer_inner();
        if real.len() != outer * real_batch * inner {
            let mut shape = self.shape.clone();
            shape[self.batch_axis] = real_batch;
            return Err(StageError::Values {
                name,
                given: real.len(),
                batch: real_batch,
                shape,
            });
        }
        if real_batch == 0 && padded_batch > 0 && matches!(self.padding, Padding::RepeatLast) {
            return Err(StageError::NothingToRepeat { name });
        }
        for o in 0..outer {
            let src = &real[o * real_batch * inner..(o + 1) * real_batch * inner];
            let dst = &mut self.data[o * max * inner..(o * max + padded_batch) * inner];
            let (head, pad) = dst.split_at_mut(real_batch * inner);
            head.copy_from_slice(src);
            match self.padding {
                Padding::Fill(value) => pad.fill(value),
                Padding::RepeatLast if !pad.is_empty() => {
                    let last = &src[(real_batch - 1) * inner..];
                    pad.chunks_exact_mut(inner)
                        .for_each(|entry| entry.copy_from_slice(last));
                }
                Padding::RepeatLast => {}
            }
        }
        Ok(self.view(padded_batch))
    }

    /// The view of the first `batch` entries along the batch axis (at most the largest).
    pub fn view(&self, batch: usize) -> StagedView<'_, T> {
        let mut strides = vec![1; self.shape.len()];
        for axis in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1] * self.shape[axis + 1];
        }
        let mut shape = self.shape.clone();
        shape[self.batch_axis] = batch.min(self.max_batch());
        StagedView {
            data: &self.data,
            shape,
            strides,
        }
    }
}

impl<T: Copy> StagedView<'_, T> {
    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements between neighbours along each axis, those of the whole buffer.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The element at `index` (one coordinate per axis, each inside the view's shape).
    ///
    /// # Panics
    /// If `index` has another rank than the view or lies outside it.
    pub fn get(&self, index: &[usize]) -> T {
        assert_eq!(index.len(), self.shape.len(), "index rank");
        assert!(
            index.iter().zip(&self.shape).all(|(i, n)| i < n),
            "index {index:?} outside {:?}",
            self.shape
        );
        let at: usize = index.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
        self.data[at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of a view, in row-major order of its shape.
    fn elements<T: Copy>(view: &StagedView<'_, T>) -> Vec<T> {
        let shape = view.shape().to_vec();
        let total: usize = shape.iter().product();
        (0..total)
            .map(|mut flat| {
                let mut index = vec![0; shape.len()];
                for axis in (0..shape.len()).rev() {
                    index[axis] = flat % shape[axis];
                    flat /= shape[axis];
                }
                view.get(&index)
            })
            .collect()
    }

    #[test]
    fn a_token_list_is_padded_with_its_last_entry() {
        let mut ids = StagedInput::new("token_ids", &[16], 0, Padding::RepeatLast).unwrap();
        let view = ids.stage(&[7, 8, 9], 3, 8).unwrap();
        assert_eq!(view.shape(), [8]);
        assert_eq!(view.strides(), [1]);
        assert_eq!(elements(&view), [7, 8, 9, 9, 9, 9, 9, 9]);
        // A smaller batch later leaves the rest of the buffer alone.
        let view = ids.stage(&[5], 1, 2).unwrap();
        assert_eq!(elements(&view), [5, 5]);
        assert_eq!(ids.as_slice()[..8], [5, 5, 9, 9, 9, 9, 9, 9]);
    }

    #[test]
    fn padded_slots_point_at_the_scratch_slot_only() {
        const SCRATCH: i64 = 4095;
        let mut slots = StagedInput::new("slot_mapping", &[8], 0, Padding::Fill(SCRATCH)).unwrap();
        let view = slots.stage(&[100, 37, 2048], 3, 8).unwrap();
        assert_eq!(
            elements(&view),
            [100, 37, 2048, SCRATCH, SCRATCH, SCRATCH, SCRATCH, SCRATCH]
        );
    }

    #[test]
    fn mrope_positions_pad_along_axis_1_and_keep_their_row_stride() {
        // [3, N] at N = 8: the temporal, height and width positions of each token.
        let mut pos = StagedInput::new("mrope_positions", &[3, 8], 1, Padding::RepeatLast).unwrap();
        let real = [10, 11, 12, 20, 21, 22, 30, 31, 32]; // [3, 3]
        let view = pos.stage(&real, 3, 4).unwrap();
        assert_eq!(view.shape(), [3, 4]);
        assert_eq!(view.strides(), [8, 1]);
        assert_eq!(
            elements(&view),
            [10, 11, 12, 12, 20, 21, 22, 22, 30, 31, 32, 32]
        );
        // The rows are 8 apart in the buffer whatever the batch.
        assert_eq!(pos.as_slice()[8..12], [20, 21, 22, 22]);
    }

    #[test]
    fn one_code_path_stages_the_batch_on_either_axis() {
        // The same positions as [N, 3] (batch on axis 0) and as [3, N] (batch on axis 1)
        // give transposed views, for every real and padded size.
        let real_rows: Vec<[i32; 3]> = (0..6).map(|t| [t, 100 + t, 200 + t]).collect();
        for real in 1..=6 {
            for padded in real..=8 {
                let mut rows = StagedInput::new("rows", &[8, 3], 0, Padding::RepeatLast).unwrap();
                let mut cols = StagedInput::new("cols", &[3, 8], 1, Padding::RepeatLast).unwrap();
                let flat: Vec<i32> = real_rows[..real].iter().flatten().copied().collect();
                let transposed: Vec<i32> = (0..3)
                    .flat_map(|axis| real_rows[..real].iter().map(move |r| r[axis]))
                    .collect();
                let a = rows.stage(&flat, real, padded).unwrap();
                let b = cols.stage(&transposed, real, padded).unwrap();
                for t in 0..padded {
                    for (axis, &want) in real_rows[t.min(real - 1)].iter().enumerate() {
                        assert_eq!(a.get(&[t, axis]), want);
                        assert_eq!(b.get(&[axis, t]), want);
                    }
                }
            }
        }
    }

    #[test]
    fn block_tables_pad_whole_rows() {
        let mut tables = StagedInput::new("block_tables", &[4, 3], 0, Padding::RepeatLast).unwrap();
        let view = tables.stage(&[1, 2, 3, 65_535, 65_536, 0], 2, 4).unwrap();
        assert_eq!(view.shape(), [4, 3]);
        assert_eq!(view.strides(), [3, 1]);
        assert_eq!(
            elements(&view),
            [1, 2, 3, 65_535, 65_536, 0, 65_535, 65_536, 0, 65_535, 65_536, 0]
        );
    }

    #[test]
    fn bad_batches_are_refused_by_name() {
        let err = StagedInput::<i32>::new("x", &[3, 8], 2, Padding::RepeatLast).unwrap_err();
        assert_eq!(
            err.to_string(),
            "staged input `x`: batch axis 2 of a 2-dimensional shape"
        );
        let mut pos = StagedInput::new("positions", &[3, 8], 1, Padding::RepeatLast).unwrap();
        let too_big = pos.stage(&[0; 27], 9, 9).unwrap_err();
        assert!(
            matches!(
                too_big,
                StageError::Batch {
                    padded: 9,
                    max: 8,
                    ..
                }
            ),
            "{too_big}"
        );
        let fewer = pos.stage(&[0; 9], 3, 2).unwrap_err();
        assert!(matches!(
            fewer,
            StageError::Batch {
                real: 3,
                padded: 2,
                ..
            }
        ));
        let short = pos.stage(&[0; 8], 3, 4).unwrap_err();
        assert_eq!(
            short.to_string(),
            "staged input `positions`: 8 values for a batch of 3 in shape [3, 3]"
        );
        let empty = pos.stage(&[], 0, 4).unwrap_err();
        assert_eq!(empty, StageError::NothingToRepeat { name: "positions" });
        let mut slots = StagedInput::new("slots", &[8], 0, Padding::Fill(-1i64)).unwrap();
        assert_eq!(elements(&slots.stage(&[], 0, 2).unwrap()), [-1, -1]);
    }
}
