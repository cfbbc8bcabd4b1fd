//! SiLU-and-multiply, the gated MLP activation.

/// `out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]` where each row of `gate_up`
/// holds the gate projection followed by the up projection (`[rows, 2 * inter]`).
pub fn silu_and_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    assert!(
        gate_up.len().is_multiple_of(2 * inter),
        "silu_and_mul: gate_up is not [rows, 2*{inter}]"
    );
    assert_eq!(
        out.len() * 2,
        gate_up.len(),
        "silu_and_mul: out is not [rows, {inter}]"
    );
    for (o, gu) in out.chunks_mut(inter).zip(gate_up.chunks(2 * inter)) {
        let (gate, up) = gu.split_at(inter);
        for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_the_up_projection() {
        let gate_up = [0.5f32, -2.0, 3.0, 1.5, -0.25, 2.0];
        let mut out = [f32::NAN; 3];
        silu_and_mul(&gate_up, 3, &mut out);
        for i in 0..3 {
            let g = gate_up[i] as f64;
            let want = g / (1.0 + (-g).exp()) * gate_up[3 + i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-6);
        }
    }
}
