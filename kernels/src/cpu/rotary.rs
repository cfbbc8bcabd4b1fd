//! Rotary position embeddings applied in place to q or k.

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotaryLayout {
    /// Hugging Face Llama's `rotate_half`: element `i` pairs with `i + head_dim / 2`.
    HalfSplit,
    /// GPT-J / llama.cpp style: element `2i` pairs with `2i + 1`.
    Interleaved,
}

/// Rotates every head of every row of `x` (`[rows, heads * head_dim]`) by the angles whose
/// cosines and sines are `cos` and `sin` (`[rows, head_dim / 2]`, one row per token).
pub fn apply_rotary(
    x: &mut [f32],
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    layout: RotaryLayout,
) {
    let half = head_dim / 2;
    let rows = cos.len() / half;
    assert!(
        head_dim.is_multiple_of(2) && cos.len() == sin.len(),
        "apply_rotary: tables"
    );
    assert!(
        rows > 0 && x.len().is_multiple_of(rows),
        "apply_rotary: x rows"
    );
    let width = x.len() / rows;
    assert!(
        width.is_multiple_of(head_dim),
        "apply_rotary: width {width} is not heads x {head_dim}"
    );
    for (r, row) in x.chunks_mut(width).enumerate() {
        let (c, s) = (
            &cos[r * half..(r + 1) * half],
            &sin[r * half..(r + 1) * half],
        );
        for head in row.chunks_mut(head_dim) {
            for i in 0..half {
                let (a, b) = match layout {
                    RotaryLayout::HalfSplit => (i, i + half),
                    RotaryLayout::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c[i] - x1 * s[i];
                head[b] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_pair_different_elements() {
        let (c, s) = (0.6f32, 0.8f32);
        let base = [1.0f32, 2.0, 3.0, 4.0];
        let mut half = base;
        apply_rotary(&mut half, 4, &[c, c], &[s, s], RotaryLayout::HalfSplit);
        assert_eq!(
            half,
            [
                1.0 * c - 3.0 * s,
                2.0 * c - 4.0 * s,
                3.0 * c + 1.0 * s,
                4.0 * c + 2.0 * s
            ]
        );
        let mut inter = base;
        apply_rotary(&mut inter, 4, &[c, c], &[s, s], RotaryLayout::Interleaved);
        assert_eq!(
            inter,
            [
                1.0 * c - 2.0 * s,
                2.0 * c + 1.0 * s,
                3.0 * c - 4.0 * s,
                4.0 * c + 3.0 * s
            ]
        );
    }
}
