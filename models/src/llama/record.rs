//! The Llama forward, recorded op by op into a [`CpuGraph`]: the one forward, run eagerly
//! (recorded, replayed once) or captured once per batch size and replayed every step.
//! Every op reads its inputs (token ids, positions, slots, attention metadata, logit rows)
//! from the staged buffers at replay, and holds owning handles of every buffer it touches.
//!
//! [`CpuGraph`]: peregrine_runtime::cpu::CpuGraph

use super::mla::{self, MlaActivations};
use super::moe::{self, MoeActivations};
use super::{ForwardError, GroupedAttention, Layer, LayerAttention, LayerMlp, LlamaModel};
use crate::config::ModelConfig;
use crate::graph::cpu::ops::{self as ops, Activations, Dims, Graph};
use crate::graph::cpu::step_io::{StepInputs, StepShape};
use peregrine_ops::{PagedAttention, RmsNorm, Rotary};
use peregrine_runtime::cpu::{BufferPool, CpuBuffer};
use std::sync::Arc;

/// Everything a forward reads and writes besides the weights and the KV cache: the staged
/// inputs, the activations and the outputs, each at the largest step it serves.
pub struct LlamaBuffers {
    /// The staged inputs.
    pub inputs: StepInputs,
    /// `[logit_rows, vocab]` the logits of the logit rows.
    pub logits: CpuBuffer<f32>,
    /// `[rows, aux_layers * hidden]` the inputs of the recorded layers (empty if none).
    pub aux: CpuBuffer<f32>,
    pub(crate) act: Activations,
    /// Latent attention's activations, for a model that has it.
    mla: Option<MlaActivations>,
    /// The mixture's activations, for a model that has one.
    moe: Option<MoeActivations>,
}

impl LlamaBuffers {
    /// The bytes the buffers of a model of `config` take at `capacity` with block tables of
    /// `max_blocks` and `aux_layers` recorded layers: counted by building them from a
    /// measuring pool, so before anything is allocated.
    pub fn bytes(
        config: &ModelConfig,
        capacity: StepShape,
        max_blocks: usize,
        aux_layers: usize,
    ) -> u64 {
        let pool = BufferPool::measuring();
        let inputs = StepInputs::new(&pool, capacity, max_blocks);
        drop(LlamaBuffers::new(&pool, config, inputs, aux_layers));
        pool.measured_bytes()
    }

    /// Activations and outputs for `inputs`' capacity, from `pool`.
    pub(crate) fn new(
        pool: &BufferPool,
        c: &ModelConfig,
        inputs: StepInputs,
        aux_layers: usize,
    ) -> LlamaBuffers {
        let cap = inputs.capacity;
        // Latent attention keeps its own buffers; the shared ones hold only its rotary
        // tables.
        let dims = match &c.mla {
            Some(m) => Dims {
                hidden: c.hidden_size,
                head_dim: m.qk_rope_head_dim,
                heads: 0,
                kv_heads: 0,
                intermediate: c.intermediate_size,
            },
            None => Dims {
                hidden: c.hidden_size,
                head_dim: c.head_dim,
                heads: c.num_heads,
                kv_heads: c.num_kv_heads,
                intermediate: c.intermediate_size,
            },
        };
        LlamaBuffers {
            logits: pool.alloc(cap.logit_rows * c.vocab_size),
            aux: pool.alloc(cap.rows * aux_layers * c.hidden_size),
            act: Activations::new(pool, dims, cap),
            mla: c.mla.as_ref().map(|_| MlaActivations::new(pool, c, cap)),
            moe: c.moe.as_ref().map(|_| MoeActivations::new(pool, c, cap)),
            inputs,
        }
    }
}

impl LlamaModel {
    /// Records the forward of a step of `shape` (at most the buffers' capacity) over
    /// `buffers` into `graph`: the logits of the first `shape.logit_rows` staged logit
    /// rows into `buffers.logits`, and the inputs of each layer of `aux_layers` into
    /// `buffers.aux`.
    pub fn record(
        &self,
        graph: &mut Graph,
        buffers: &LlamaBuffers,
        shape: StepShape,
        aux_layers: &[usize],
    ) -> Result<(), ForwardError> {
        let cap = buffers.inputs.capacity;
        if shape.rows > cap.rows || shape.seqs > cap.seqs || shape.logit_rows > cap.logit_rows {
            return Err(ForwardError::TokenCount {
                tokens: shape.rows,
                rows: cap.rows,
            });
        }
        let layers = self.config.num_layers;
        if let Some(&layer) = aux_layers.iter().find(|&&l| l > layers) {
            return Err(ForwardError::AuxLayer { layer, layers });
        }
        let (b, n) = (buffers, shape.rows);
        let h = self.config.hidden_size;
        ops::embedding(graph, &b.inputs, &self.embed, &b.act.residual, n, h);
        ops::rotary_tables(graph, &b.inputs, &b.act, &self.rotary, n);
        for (l, layer) in self.layers.iter().enumerate() {
            self.record_layer(graph, buffers, shape, l, layer, aux_layers)?;
        }
        ops::logits(
            graph,
            &b.inputs,
            &b.act,
            &self.norm,
            &self.lm_head,
            &b.logits,
            shape,
        );
        // "Layer `num_layers`'s input": the residual after the last layer.
        self.record_aux(graph, b, n, layers, aux_layers);
        Ok(())
    }

    /// One decoder layer.
    fn record_layer(
        &self,
        graph: &mut Graph,
        b: &LlamaBuffers,
        shape: StepShape,
        l: usize,
        layer: &Arc<Layer>,
        aux_layers: &[usize],
    ) -> Result<(), ForwardError> {
        record_input_norm(graph, b, shape.rows, layer, l == 0);
        self.record_aux(graph, b, shape.rows, l, aux_layers);
        let block = Block {
            layer,
            rotary: &self.rotary,
            attention: self.attention,
            cache_layer: l,
        };
        record_block(graph, b, shape, block)
    }

    /// Copies the residual stream (layer `l`'s input) into every slot of the aux buffer
    /// that `aux_layers` gives to layer `l`.
    fn record_aux(
        &self,
        graph: &mut Graph,
        b: &LlamaBuffers,
        n: usize,
        l: usize,
        aux_layers: &[usize],
    ) {
        let h = self.config.hidden_size;
        let width = aux_layers.len() * h;
        for (slot, _) in aux_layers.iter().enumerate().filter(|(_, &a)| a == l) {
            let (res, aux) = (b.act.residual.clone(), b.aux.clone());
            graph.record("record_hidden", &[res.handle(), aux.handle()], move |_| {
                let mut aux = aux.write();
                for (row, out) in res.read()[..n * h].chunks(h).zip(aux.chunks_mut(width)) {
                    out[slot * h..(slot + 1) * h].copy_from_slice(row);
                }
                Ok(())
            });
        }
    }
}

/// What one decoder block records: its layer's weights, the rotary embedding and
/// attention settings, and the cache layer its keys and values go to.
pub(crate) struct Block<'a> {
    pub layer: &'a Arc<Layer>,
    pub rotary: &'a Arc<Rotary>,
    pub attention: PagedAttention,
    pub cache_layer: usize,
}

/// `input_layernorm` of the first `n` rows into `b`'s normed buffer: of the residual as
/// it is (`first`: it holds the block's input), else after the last delta is added.
pub(crate) fn record_input_norm(
    graph: &mut Graph,
    b: &LlamaBuffers,
    n: usize,
    layer: &Arc<Layer>,
    first: bool,
) {
    let a = &b.act;
    let h = a.dims.hidden;
    let (res, normed, delta) = (a.residual.clone(), a.normed.clone(), a.delta.clone());
    let ly = layer.clone();
    let handles = [res.handle(), delta.handle(), normed.handle()];
    graph.record("input_norm", &handles, move |_| {
        let out = &mut normed.write()[..n * h];
        if first {
            ly.input_norm.forward(&res.read()[..n * h], out);
        } else {
            let delta = &delta.read()[..n * h];
            ly.input_norm
                .forward_residual(&mut res.write()[..n * h], delta, out);
        }
        Ok(())
    });
}

/// A decoder block after its input norm: the attention (its keys and values, or latent
/// rows, into `block.cache_layer`), the post-attention norm, the MLP, leaving the MLP's
/// output in the delta buffer.
pub(crate) fn record_block(
    graph: &mut Graph,
    b: &LlamaBuffers,
    shape: StepShape,
    block: Block,
) -> Result<(), ForwardError> {
    let Block {
        layer,
        rotary,
        attention,
        cache_layer: l,
    } = block;
    let (a, n) = (&b.act, shape.rows);
    match &layer.attention {
        LayerAttention::Grouped(g) => {
            ops::linear(graph, "qkv", g, |g| &g.qkv, &a.normed, &a.qkv, n);
            ops::split_qkv(graph, a, n);
            ops::qk_norm_rope(graph, a, rotary, g, qk_norms, n);
            ops::write_kv(graph, &b.inputs, a, n, l);
            ops::attention(graph, &b.inputs, a, attention, shape, l)?;
            ops::linear(graph, "o_proj", g, |g| &g.o_proj, &a.attn, &a.delta, n);
        }
        LayerAttention::Latent(m) => {
            let acts = b.mla.as_ref().expect("latent buffers of a latent model");
            mla::record(graph, &b.inputs, a, acts, m, rotary, shape, l)?;
        }
    }
    ops::add_norm(graph, "post_norm", a, layer, |ly| &ly.post_norm, n);
    match &layer.mlp {
        LayerMlp::Dense(mlp) => {
            ops::linear(
                graph,
                "gate_up",
                mlp,
                |m| &m.gate_up,
                &a.normed,
                &a.gate_up,
                n,
            );
            ops::silu_and_mul(graph, a, n);
            ops::linear(graph, "down", mlp, |m| &m.down, &a.act, &a.delta, n);
        }
        LayerMlp::Experts(moe) => {
            let acts = b.moe.as_ref().expect("mixture buffers of a mixture model");
            moe::record(graph, a, acts, moe, n);
        }
    }
    Ok(())
}

/// The layer's per-head q and k norms, if it has them (Qwen3).
fn qk_norms(g: &GroupedAttention) -> Option<(&RmsNorm, &RmsNorm)> {
    g.q_norm.as_ref().zip(g.k_norm.as_ref())
}
