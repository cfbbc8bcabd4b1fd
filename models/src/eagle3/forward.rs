//! One forward of an EAGLE-3 head on the CPU (reference §1.2):
//!
//! ```text
//! u  = cat(input_layernorm(embed(x)), hidden_norm(g))        [T, 2H]
//! h1 = r + o_proj(attn(rope(q(u)), rope(k(u)), v(u)))         r = g, or hidden_norm(g)
//! h2 = h1 + down(silu(gate(n)) * up(n)),  n = post_attention_layernorm(h1)
//! pre = h2;  logits = lm_head(norm(h2))                       [rows, V_d]
//! ```

use super::Eagle3Head;
use crate::llama::{check_inputs, row_logits, ForwardError};
use peregrine_kernels::cpu::{embedding, silu_and_mul};
use peregrine_ops::{AttentionPlan, KvCache};

/// The feature `g` of each row.
#[derive(Clone, Copy, Debug)]
pub enum HeadInput<'a> {
    /// Step 0: the target's auxiliary hidden states, `[T, aux_layers.len() * H_t]`, which
    /// go through `fc`.
    Aux(&'a [f32]),
    /// Later steps: each row's previous `pre`, `[T, H]`, used as is.
    Pre(&'a [f32]),
}

/// What one forward of the head returns.
#[derive(Clone, Debug)]
pub struct HeadOutput {
    /// Draft-vocabulary logits of the requested rows, `[logit_rows.len(), V_d]`.
    pub logits: Vec<f32>,
    /// `h2` of every row, `[T, H]`: the next step's [`HeadInput::Pre`].
    pub pre: Vec<f32>,
}

impl Eagle3Head {
    /// Runs `tokens` (target ids, one per planned row) with features `input` through the
    /// head, writing their keys and values into layer 0 of `cache` (a one-layer cache of
    /// [`kv_layout`](Self::kv_layout), addressed by the same plan as the target), and
    /// returns the logits of `logit_rows` and `pre` of every row.
    pub fn forward(
        &self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
    ) -> Result<HeadOutput, ForwardError> {
        let c = &self.config;
        check_inputs(tokens, plan, logit_rows, c.vocab_size)?;
        let n = tokens.len();
        let (h, d, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let mut g = vec![0.0; n * h];
        match input {
            HeadInput::Aux(aux) => {
                check_width("aux hidden states", aux, n, self.fc.in_features())?;
                self.fc.forward(aux, &mut g);
            }
            HeadInput::Pre(pre) => {
                check_width("pre", pre, n, h)?;
                g.copy_from_slice(pre);
            }
        }
        let mut e = vec![0.0; n * h];
        embedding(tokens, &self.embed, h, &mut e);
        let (mut e_normed, mut g_normed) = (vec![0.0; n * h], vec![0.0; n * h]);
        self.input_norm.forward(&e, &mut e_normed);
        self.hidden_norm.forward(&g, &mut g_normed);
        let u: Vec<f32> = e_normed
            .chunks(h)
            .zip(g_normed.chunks(h))
            .flat_map(|(a, b)| a.iter().chain(b).copied())
            .collect();
        let mut qkv = vec![0.0; n * (qd + 2 * kvd)];
        self.qkv.forward(&u, &mut qkv);
        let (mut q, mut k, mut v) = (vec![0.0; n * qd], vec![0.0; n * kvd], vec![0.0; n * kvd]);
        for (r, row) in qkv.chunks(qd + 2 * kvd).enumerate() {
            q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
            k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
            v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
        }
        let tables = self.rotary.tables(plan.positions());
        self.rotary.apply(&mut q, &tables);
        self.rotary.apply(&mut k, &tables);
        cache.write(0, plan.slot_mapping(), &k, &v);
        let mut attn = vec![0.0; n * qd];
        self.attention.forward(&q, &mut attn, cache, 0, plan)?;
        let mut delta = vec![0.0; n * h];
        self.o_proj.forward(&attn, &mut delta);
        // The residual stream: g, or hidden_norm(g); it becomes h1, then h2.
        let mut residual = if c.norm_before_residual { g_normed } else { g };
        let mut normed = vec![0.0; n * h];
        self.post_norm
            .forward_residual(&mut residual, &delta, &mut normed);
        let mut gate_up = vec![0.0; n * 2 * inter];
        self.gate_up.forward(&normed, &mut gate_up);
        let mut act = vec![0.0; n * inter];
        silu_and_mul(&gate_up, inter, &mut act);
        self.down.forward(&act, &mut delta);
        residual.iter_mut().zip(&delta).for_each(|(r, d)| *r += d);
        let logits = row_logits(
            &residual,
            h,
            logit_rows,
            &self.norm,
            &self.lm_head,
            c.draft_vocab_size,
        );
        Ok(HeadOutput {
            logits,
            pre: residual,
        })
    }
}

fn check_width(
    what: &'static str,
    values: &[f32],
    rows: usize,
    width: usize,
) -> Result<(), ForwardError> {
    if values.len() != rows * width {
        return Err(ForwardError::HiddenShape {
            what,
            len: values.len(),
            rows,
            width,
        });
    }
    Ok(())
}
