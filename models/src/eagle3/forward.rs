//! One forward of an EAGLE-3 head on the CPU (the single decoder layer of the EAGLE-3
//! paper, arXiv 2503.01840, as vLLM loads it):
//!
//! ```text
//! u  = cat(input_layernorm(embed(x)), hidden_norm(g))        [T, 2H]
//! h1 = r + o_proj(attn(rope(q(u)), rope(k(u)), v(u)))         r = g, or hidden_norm(g)
//! h2 = h1 + down(silu(gate(n)) * up(n)),  n = post_attention_layernorm(h1)
//! pre = h2;  logits = lm_head(norm(h2))                       [rows, V_d]
//! ```

use super::record::FeatureKind;
use super::Eagle3Head;
use crate::graph::cpu::head::forward_eagerly;
use crate::llama::ForwardError;
use peregrine_ops::{AttentionPlan, KvCache};

/// The feature `g` of each row.
#[derive(Clone, Copy, Debug)]
pub enum HeadInput<'a> {
    /// Step 0: the target's auxiliary hidden states, `[T, aux_layers.len() * H_t]`, which
    /// go through `fc`.
    Aux(&'a [f32]),
    /// Step 0 on the GPU: the same states as rows of the feature ring the target stored
    /// them into on the device (`feature_ring::FeatureRing`), one row number per token. A
    /// head on the CPU refuses them.
    Ring(&'a [u64]),
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

impl HeadInput<'_> {
    /// The kind of feature.
    pub fn kind(&self) -> FeatureKind {
        match self {
            HeadInput::Aux(_) | HeadInput::Ring(_) => FeatureKind::Aux,
            HeadInput::Pre(_) => FeatureKind::Pre,
        }
    }

    /// The number of rows of a [`HeadInput::Ring`]; 0 for host features.
    pub fn rows(&self) -> usize {
        match self {
            HeadInput::Ring(ids) => ids.len(),
            HeadInput::Aux(_) | HeadInput::Pre(_) => 0,
        }
    }

    /// The kind of feature and its rows on the host; `None` for rows in a feature ring.
    pub fn host(&self) -> Option<(FeatureKind, &[f32])> {
        match *self {
            HeadInput::Aux(aux) => Some((FeatureKind::Aux, aux)),
            HeadInput::Pre(pre) => Some((FeatureKind::Pre, pre)),
            HeadInput::Ring(_) => None,
        }
    }
}

impl Eagle3Head {
    /// Runs `tokens` (target ids, one per planned row) with features `input` through the
    /// head, writing their keys and values into layer 0 of `cache` (a one-layer cache of
    /// [`kv_layout`](Self::kv_layout), addressed by the same plan as the target), and
    /// returns the logits of `logit_rows` and `pre` of every row. The step is staged at its
    /// own size into buffers from the head's pool, recorded into a graph and replayed once
    /// (a captured graph replays the same recording).
    pub fn forward(
        &self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
    ) -> Result<HeadOutput, ForwardError> {
        forward_eagerly(
            self,
            self.config.vocab_size,
            tokens,
            input,
            plan,
            cache,
            logit_rows,
        )
    }
}
