//! Rotary position embeddings: inverse frequencies (with "linear", "llama3" and "yarn"
//! scaling), per-step cos/sin tables, and their application to q and k.

use peregrine_kernels::cpu;
pub use peregrine_kernels::cpu::RotaryLayout;
use std::f64::consts::PI;

/// How the base frequencies are stretched for longer contexts (Hugging Face `rope_scaling`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN (Peng et al. 2309.00071): frequencies interpolated by `factor` below a ramp
    /// between the dimensions that turn `beta_slow` and `beta_fast` times over the original
    /// context, kept above it; cos and sin are multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// Whether the ramp's ends are rounded outwards to whole dimensions.
        truncate: bool,
        attention_factor: f64,
    },
}

/// Rotary embedding for heads of `head_dim` elements.
#[derive(Clone, Debug)]
pub struct Rotary {
    inv_freq: Vec<f64>,
    /// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    magnitude: f64,
    head_dim: usize,
    layout: RotaryLayout,
}

/// Cosines and sines for one step's tokens, `[tokens, head_dim / 2]` each.
#[derive(Clone, Debug, Default)]
pub struct RotaryTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rotary {
    /// Frequencies `theta^(-2i/head_dim)`, scaled as `scaling` says.
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, layout: RotaryLayout) -> Rotary {
        let inv_freq = (0..head_dim / 2)
            .map(|i| {
                let f = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                scale_frequency(f, i, head_dim, theta, scaling)
            })
            .collect();
        let magnitude = match *scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        };
        Rotary {
            inv_freq,
            magnitude,
            head_dim,
            layout,
        }
    }

    /// The cos/sin tables for tokens at `positions`, computed in float64 and rounded once.
    pub fn tables(&self, positions: &[u32]) -> RotaryTables {
        let n = positions.len() * self.inv_freq.len();
        let (mut cos, mut sin) = (vec![0.0; n], vec![0.0; n]);
        self.tables_into(positions, &mut cos, &mut sin);
        RotaryTables { cos, sin }
    }

    /// Cosines and sines per position (`head_dim / 2` each), as [`Rotary::tables`] holds
    /// them, into `cos` and `sin` (`[positions.len(), head_dim / 2]`).
    pub fn tables_into(&self, positions: &[u32], cos: &mut [f32], sin: &mut [f32]) {
        let half = self.inv_freq.len();
        let rows = cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half));
        for (&p, (cos, sin)) in positions.iter().zip(rows) {
            for ((f, c), s) in self.inv_freq.iter().zip(cos).zip(sin) {
                let (sv, cv) = (p as f64 * f).sin_cos();
                (*c, *s) = ((cv * self.magnitude) as f32, (sv * self.magnitude) as f32);
            }
        }
    }

    /// Elements of one position's cosines (or sines): `head_dim / 2`.
    pub fn half_dim(&self) -> usize {
        self.inv_freq.len()
    }

    /// The table the GPU rotary kernel reads: for each position `0..positions`, the
    /// `head_dim / 2` cosines then the `head_dim / 2` sines.
    pub fn cos_sin_table(&self, positions: u32) -> Vec<f32> {
        let all: Vec<u32> = (0..positions).collect();
        let tables = self.tables(&all);
        let half = self.inv_freq.len();
        tables
            .cos
            .chunks(half)
            .zip(tables.sin.chunks(half))
            .flat_map(|(c, s)| c.iter().chain(s).copied())
            .collect()
    }

    /// Whether pairs are interleaved (2i, 2i+1) rather than split (i, i + head_dim/2).
    pub fn is_interleaved(&self) -> bool {
        self.layout == RotaryLayout::Interleaved
    }

    /// Rotates every head of `x` (`[tokens, heads * head_dim]`) in place.
    pub fn apply(&self, x: &mut [f32], tables: &RotaryTables) {
        self.apply_with(x, &tables.cos, &tables.sin);
    }

    /// [`Rotary::apply`] with the tables as [`Rotary::tables_into`] wrote them.
    pub fn apply_with(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        cpu::apply_rotary(x, self.head_dim, cos, sin, self.layout);
    }
}

/// Frequency `f` of pair `i` of `head_dim` (base `theta`), scaled as `scaling` says.
fn scale_frequency(f: f64, i: usize, head_dim: usize, theta: f64, scaling: &RopeScaling) -> f64 {
    match *scaling {
        RopeScaling::None => f,
        RopeScaling::Linear { factor } => f / factor,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        } => {
            let wavelen = 2.0 * PI / f;
            let (short, long) = (old / high_freq_factor, old / low_freq_factor);
            if wavelen < short {
                f
            } else if wavelen > long {
                f / factor
            } else {
                let t = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - t) * f / factor + t * f
            }
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: old,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            let d = head_dim as f64;
            // The dimension whose pair turns `turns` times over the original context.
            let dim_of = |turns: f64| d * (old / (turns * 2.0 * PI)).ln() / (2.0 * theta.ln());
            let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, high) = (low.max(0.0), high.min(d - 1.0));
            let high = if low == high { high + 0.001 } else { high };
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            // Pairs below the ramp keep their frequency, those past it are interpolated.
            let kept = 1.0 - ramp;
            f / factor * (1.0 - kept) + f * kept
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = Rotary::new(128, 500000.0, &RopeScaling::None, RotaryLayout::HalfSplit);
        let scaled = Rotary::new(128, 500000.0, &s, RotaryLayout::HalfSplit);
        // Wavelength below 8192/4 = 2048 keeps its frequency, above 8192 is divided by 8.
        assert_eq!(scaled.inv_freq[0], plain.inv_freq[0]);
        assert_eq!(scaled.inv_freq[63], plain.inv_freq[63] / 8.0);
        let mid = plain
            .inv_freq
            .iter()
            .position(|f| (2048.0..8192.0).contains(&(2.0 * PI / f)))
            .unwrap();
        assert!(scaled.inv_freq[mid] < plain.inv_freq[mid]);
        assert!(scaled.inv_freq[mid] > plain.inv_freq[mid] / 8.0);
    }

    #[test]
    fn yarn_keeps_fast_pairs_interpolates_slow_ones_and_scales_the_tables() {
        let yarn = RopeScaling::Yarn {
            factor: 40.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: 1.25,
        };
        let plain = Rotary::new(64, 10000.0, &RopeScaling::None, RotaryLayout::Interleaved);
        let scaled = Rotary::new(64, 10000.0, &yarn, RotaryLayout::Interleaved);
        // DeepSeek-V2-Lite's rope: the ramp runs from dimension 10 to 23 (of 32 pairs).
        let dim_of = |turns: f64| 64.0 * (4096.0 / (turns * 2.0 * PI)).ln() / (2.0 * 10000f64.ln());
        assert_eq!((dim_of(32.0).floor(), dim_of(1.0).ceil()), (10.0, 23.0));
        for i in 0..=10 {
            assert_eq!(scaled.inv_freq[i], plain.inv_freq[i], "pair {i}");
        }
        for i in 23..32 {
            assert_eq!(scaled.inv_freq[i], plain.inv_freq[i] / 40.0, "pair {i}");
        }
        let t = (16.0 - 10.0) / 13.0;
        let mid = plain.inv_freq[16] * (t / 40.0 + (1.0 - t));
        assert!((scaled.inv_freq[16] - mid).abs() < 1e-15 * mid.abs().max(1.0));
        let (a, b) = (plain.tables(&[5]), scaled.tables(&[5]));
        assert!((b.cos[0] - 1.25 * a.cos[0]).abs() < 1e-6);
        assert!((b.sin[3] - 1.25 * a.sin[3]).abs() < 1e-6);
    }

    #[test]
    fn linear_scaling_stretches_positions() {
        let plain = Rotary::new(8, 10000.0, &RopeScaling::None, RotaryLayout::Interleaved);
        let lin = Rotary::new(
            8,
            10000.0,
            &RopeScaling::Linear { factor: 4.0 },
            RotaryLayout::Interleaved,
        );
        let (a, b) = (plain.tables(&[3]), lin.tables(&[12]));
        for (x, y) in a.cos.iter().zip(&b.cos) {
            assert!((x - y).abs() < 1e-6);
        }
    }
}
