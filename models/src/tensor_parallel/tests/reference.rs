//! A tiny random Llama (embedding, one decoder layer, final norm, LM head) and its
//! unsharded float64 forward: the reference the tensor-parallel forward must equal.

use super::math::{add, attention, linear, rms_norm, rope, swiglu};
use super::random;
use crate::tensor_parallel::TpShape;

/// RMSNorm's epsilon and RoPE's base in the tiny model.
pub const EPS: f64 = 1e-5;
pub const THETA: f64 = 10000.0;

/// The full weights, row-major `[out, in]`, as the checkpoint stores them.
pub struct TinyModel {
    pub shape: TpShape,
    pub embed: Vec<f64>,
    pub input_norm: Vec<f64>,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub q_bias: Vec<f64>,
    pub k_bias: Vec<f64>,
    pub v_bias: Vec<f64>,
    pub o: Vec<f64>,
    pub post_norm: Vec<f64>,
    pub gate: Vec<f64>,
    pub up: Vec<f64>,
    pub down: Vec<f64>,
    pub norm: Vec<f64>,
    pub lm_head: Vec<f64>,
}

impl TinyModel {
    /// Random weights of `shape` from `seed` (norm weights around 1).
    pub fn new(shape: TpShape, seed: u64) -> TinyModel {
        let s = &shape;
        let (h, i, v) = (s.hidden_size, s.intermediate_size, s.vocab_size);
        let (qd, kvd) = (s.q_width(), s.kv_width());
        let mut n = seed * 100;
        let mut next = |len: usize| {
            n += 1;
            random(n, len)
        };
        let mut norm = |len| next(len).iter().map(|x| 1.0 + 0.5 * x).collect::<Vec<_>>();
        let (input_norm, post_norm, final_norm) = (norm(h), norm(h), norm(h));
        let mut n = seed * 100 + 50;
        let mut next = |len: usize| {
            n += 1;
            random(n, len)
        };
        TinyModel {
            shape,
            embed: next(v * h),
            input_norm,
            q: next(qd * h),
            k: next(kvd * h),
            v: next(kvd * h),
            q_bias: next(qd),
            k_bias: next(kvd),
            v_bias: next(kvd),
            o: next(h * qd),
            post_norm,
            gate: next(i * h),
            up: next(i * h),
            down: next(h * i),
            norm: final_norm,
            lm_head: next(v * h),
        }
    }

    /// q, k and v stacked as `LlamaModel` holds them (`[qd + 2 kvd, hidden]`).
    pub fn qkv(&self) -> Vec<f64> {
        [&self.q[..], &self.k, &self.v].concat()
    }

    /// The q, k and v biases stacked as `LlamaModel` holds them.
    pub fn qkv_bias(&self) -> Vec<f64> {
        [&self.q_bias[..], &self.k_bias, &self.v_bias].concat()
    }

    /// gate and up stacked as `LlamaModel` holds them (`[2 inter, hidden]`).
    pub fn gate_up(&self) -> Vec<f64> {
        [&self.gate[..], &self.up].concat()
    }

    /// The logits of every position of `tokens` (causal).
    pub fn forward(&self, tokens: &[usize]) -> Vec<Vec<f64>> {
        let s = &self.shape;
        let h = s.hidden_size;
        let x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| self.embed[t * h..(t + 1) * h].to_vec())
            .collect();
        let n = rms_norm(&x, &self.input_norm, EPS);
        let mut q = linear(&n, &self.q, Some(&self.q_bias));
        let mut k = linear(&n, &self.k, Some(&self.k_bias));
        let v = linear(&n, &self.v, Some(&self.v_bias));
        rope(&mut q, s.head_dim, THETA);
        rope(&mut k, s.head_dim, THETA);
        let a = attention(&q, &k, &v, s.num_heads, s.num_kv_heads, s.head_dim);
        let x = add(&x, &linear(&a, &self.o, None));
        let n = rms_norm(&x, &self.post_norm, EPS);
        let act = swiglu(&linear(&n, &self.gate, None), &linear(&n, &self.up, None));
        let x = add(&x, &linear(&act, &self.down, None));
        linear(&rms_norm(&x, &self.norm, EPS), &self.lm_head, None)
    }
}
