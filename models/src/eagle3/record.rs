//! The head's forward, recorded op by op into a [`CpuGraph`] over its buffers: the one
//! forward, run eagerly (recorded, replayed once) or captured once per batch size and
//! replayed every draft step. Every op reads its inputs (token ids, features, positions,
//! slots, attention metadata, logit rows) from the staged buffers at replay and holds
//! owning handles of every buffer it touches.
//!
//! [`CpuGraph`]: peregrine_runtime::cpu::CpuGraph

use super::load::HeadWeights;
use super::Eagle3Head;
use crate::graph::cpu::head::{GraphHead, HeadIo};
use crate::graph::cpu::ops::{self as ops, Activations, Dims, Graph};
use crate::graph::cpu::step_io::{StepInputs, StepShape};
use crate::llama::ForwardError;
use peregrine_runtime::cpu::CpuBuffer;

/// Which feature `g` a forward reads (see [`HeadInput`](super::HeadInput)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureKind {
    /// The target's auxiliary hidden states, through `fc`.
    Aux,
    /// Each row's previous `pre`, as is.
    Pre,
}

/// Everything a forward of the head reads and writes besides its weights and the KV
/// cache, each at the largest step it serves.
pub struct HeadBuffers {
    /// The staged inputs.
    pub inputs: StepInputs,
    /// `[rows, width]` the staged feature of each row (the aux width, or `H`).
    pub feature: CpuBuffer<f32>,
    /// `[logit_rows, V_d]` the draft logits of the logit rows.
    pub logits: CpuBuffer<f32>,
    kind: FeatureKind,
    g: CpuBuffer<f32>,
    e: CpuBuffer<f32>,
    g_normed: CpuBuffer<f32>,
    u: CpuBuffer<f32>,
    act: Activations,
}

impl HeadBuffers {
    /// `[rows, H]` every row's `pre` (`h2`) after a replay.
    pub fn pre(&self) -> &CpuBuffer<f32> {
        &self.act.residual
    }
}

impl Eagle3Head {
    /// Width of one row of the feature of `kind`.
    pub fn feature_width(&self, kind: FeatureKind) -> usize {
        match kind {
            FeatureKind::Aux => self.weights.fc.in_features(),
            FeatureKind::Pre => self.config.hidden_size,
        }
    }

    /// The buffers a forward of up to `capacity` with features of `kind` reads and
    /// writes, from the head's pool, with block tables of `max_blocks`.
    pub fn buffers(
        &self,
        capacity: StepShape,
        max_blocks: usize,
        kind: FeatureKind,
    ) -> HeadBuffers {
        let c = &self.config;
        let (pool, n, h) = (&self.pool, capacity.rows, c.hidden_size);
        let dims = Dims {
            hidden: h,
            head_dim: c.head_dim,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            intermediate: c.intermediate_size,
        };
        HeadBuffers {
            inputs: StepInputs::new(pool, capacity, max_blocks),
            feature: pool.alloc(n * self.feature_width(kind)),
            logits: pool.alloc(capacity.logit_rows * c.draft_vocab_size),
            kind,
            g: pool.alloc(n * h),
            e: pool.alloc(n * h),
            g_normed: pool.alloc(n * h),
            u: pool.alloc(n * 2 * h),
            act: Activations::new(pool, dims, capacity),
        }
    }

    /// Records the head's forward of a step of `shape` (at most the buffers' capacity)
    /// over `b` into `graph`: the draft logits of the first `shape.logit_rows` staged logit
    /// rows into `b.logits`, every row's `pre` into [`HeadBuffers::pre`], and the keys and
    /// values into layer 0 of the cache.
    pub fn record(
        &self,
        graph: &mut Graph,
        b: &HeadBuffers,
        shape: StepShape,
    ) -> Result<(), ForwardError> {
        let cap = b.inputs.capacity;
        if shape.rows > cap.rows || shape.seqs > cap.seqs || shape.logit_rows > cap.logit_rows {
            return Err(ForwardError::TokenCount {
                tokens: shape.rows,
                rows: cap.rows,
            });
        }
        let (w, a, n, h) = (&self.weights, &b.act, shape.rows, self.config.hidden_size);
        let g = match b.kind {
            FeatureKind::Aux => {
                ops::linear(graph, "fc", w, |w| &w.fc, &b.feature, &b.g, n);
                &b.g
            }
            FeatureKind::Pre => &b.feature,
        };
        ops::embedding(graph, &b.inputs, &w.embed, &b.e, n, h);
        self.record_input(graph, b, g, n);
        ops::linear(graph, "qkv", w, |w| &w.qkv, &b.u, &a.qkv, n);
        ops::split_qkv(graph, a, n);
        ops::rotary_tables(graph, &b.inputs, a, &w.rotary, n);
        ops::qk_norm_rope(graph, a, &w.rotary, w, |_: &HeadWeights| None, n);
        ops::write_kv(graph, &b.inputs, a, n, 0);
        ops::attention(graph, &b.inputs, a, self.attention, shape, 0)?;
        ops::linear(graph, "o_proj", w, |w| &w.o_proj, &a.attn, &a.delta, n);
        // The residual stream: g, or hidden_norm(g); it becomes h1, then h2.
        let from = if self.config.norm_before_residual {
            b.g_normed.clone()
        } else {
            g.clone()
        };
        let res = a.residual.clone();
        graph.record("residual", &[from.handle(), res.handle()], move |_| {
            res.write()[..n * h].copy_from_slice(&from.read()[..n * h]);
            Ok(())
        });
        ops::add_norm(graph, "post_norm", a, w, |w| &w.post_norm, n);
        ops::linear(
            graph,
            "gate_up",
            w,
            |w| &w.gate_up,
            &a.normed,
            &a.gate_up,
            n,
        );
        ops::silu_and_mul(graph, a, n);
        ops::linear(graph, "down", w, |w| &w.down, &a.act, &a.delta, n);
        ops::logits(graph, &b.inputs, a, &w.norm, &w.lm_head, &b.logits, shape);
        Ok(())
    }

    /// `u = cat(input_layernorm(e), hidden_norm(g))` of the first `n` rows, keeping
    /// `hidden_norm(g)`.
    fn record_input(&self, graph: &mut Graph, b: &HeadBuffers, g: &CpuBuffer<f32>, n: usize) {
        let h = self.config.hidden_size;
        let (w, e, g) = (self.weights.clone(), b.e.clone(), g.clone());
        let (e_normed, g_normed, u) = (b.act.normed.clone(), b.g_normed.clone(), b.u.clone());
        let handles = [
            e.handle(),
            g.handle(),
            e_normed.handle(),
            g_normed.handle(),
            u.handle(),
        ];
        graph.record("head_input", &handles, move |_| {
            let (mut en, mut gn) = (e_normed.write(), g_normed.write());
            let (en, gn) = (&mut en[..n * h], &mut gn[..n * h]);
            w.input_norm.forward(&e.read()[..n * h], en);
            w.hidden_norm.forward(&g.read()[..n * h], gn);
            let mut u = u.write();
            for ((out, a), b) in u[..n * 2 * h]
                .chunks_mut(2 * h)
                .zip(en.chunks(h))
                .zip(gn.chunks(h))
            {
                out[..h].copy_from_slice(a);
                out[h..].copy_from_slice(b);
            }
            Ok(())
        });
    }
}

impl HeadIo for HeadBuffers {
    fn inputs(&self) -> &StepInputs {
        &self.inputs
    }

    fn feature(&self) -> &CpuBuffer<f32> {
        &self.feature
    }

    fn logits(&self) -> &CpuBuffer<f32> {
        &self.logits
    }

    fn pre(&self) -> &CpuBuffer<f32> {
        HeadBuffers::pre(self)
    }
}

impl GraphHead for Eagle3Head {
    type Buffers = HeadBuffers;

    fn feature_width(&self, kind: FeatureKind) -> usize {
        Eagle3Head::feature_width(self, kind)
    }

    fn buffers(&self, capacity: StepShape, max_blocks: usize, kind: FeatureKind) -> HeadBuffers {
        Eagle3Head::buffers(self, capacity, max_blocks, kind)
    }

    fn record(
        &self,
        graph: &mut Graph,
        b: &HeadBuffers,
        shape: StepShape,
    ) -> Result<(), ForwardError> {
        Eagle3Head::record(self, graph, b, shape)
    }
}
