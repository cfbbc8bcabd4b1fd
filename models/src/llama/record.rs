//! The Llama forward, recorded op by op into a [`CpuGraph`]: the one forward, run eagerly
//! (recorded, replayed once) or captured once per batch size and replayed every step.
//! Every op reads its inputs (token ids, positions, slots, attention metadata, logit rows)
//! from the staged buffers at replay, and holds owning handles of every buffer it touches.

use super::{ForwardError, Layer, LlamaModel};
use crate::config::ModelConfig;
use crate::step_io::{StepInputs, StepShape};
use peregrine_kernels::cpu::{embedding, silu_and_mul};
use peregrine_ops::{AttentionPlan, KvCache, StagedMeta};
use peregrine_runtime::cpu_graph::{BufferPool, CpuBuffer, CpuGraph, OpError};
use std::sync::Arc;

/// A graph of the forward, run against the KV cache.
type Graph = CpuGraph<KvCache>;

/// Everything a forward reads and writes besides the weights and the KV cache: the staged
/// inputs, the activations and the outputs, each at the largest step it serves.
pub struct LlamaBuffers {
    /// The staged inputs.
    pub inputs: StepInputs,
    /// `[logit_rows, vocab]` the logits of the logit rows.
    pub logits: CpuBuffer<f32>,
    /// `[rows, aux_layers * hidden]` the inputs of the recorded layers (empty if none).
    pub aux: CpuBuffer<f32>,
    residual: CpuBuffer<f32>,
    normed: CpuBuffer<f32>,
    delta: CpuBuffer<f32>,
    qkv: CpuBuffer<f32>,
    q: CpuBuffer<f32>,
    k: CpuBuffer<f32>,
    v: CpuBuffer<f32>,
    attn: CpuBuffer<f32>,
    gate_up: CpuBuffer<f32>,
    act: CpuBuffer<f32>,
    cos: CpuBuffer<f32>,
    sin: CpuBuffer<f32>,
    picked: CpuBuffer<f32>,
    picked_normed: CpuBuffer<f32>,
}

impl LlamaBuffers {
    /// Activations and outputs for `inputs`' capacity, from `pool`.
    pub(super) fn new(
        pool: &BufferPool,
        c: &ModelConfig,
        inputs: StepInputs,
        aux_layers: usize,
    ) -> LlamaBuffers {
        let (n, r) = (inputs.capacity.rows, inputs.capacity.logit_rows);
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let f = |len: usize| pool.alloc::<f32>(len);
        LlamaBuffers {
            logits: f(r * c.vocab_size),
            aux: f(n * aux_layers * h),
            residual: f(n * h),
            normed: f(n * h),
            delta: f(n * h),
            qkv: f(n * (qd + 2 * kvd)),
            q: f(n * qd),
            k: f(n * kvd),
            v: f(n * kvd),
            attn: f(n * qd),
            gate_up: f(n * 2 * c.intermediate_size),
            act: f(n * c.intermediate_size),
            cos: f(n * d / 2),
            sin: f(n * d / 2),
            picked: f(r * h),
            picked_normed: f(r * h),
            inputs,
        }
    }
}

/// A value an op refuses, as its error.
fn refuse(message: String) -> OpError {
    message.into()
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
        if let Some(&layer) = aux_layers.iter().find(|&&l| l >= layers) {
            return Err(ForwardError::AuxLayer { layer, layers });
        }
        self.record_embedding(graph, buffers, shape.rows);
        for (l, layer) in self.layers.iter().enumerate() {
            self.record_layer(graph, buffers, shape, l, layer, aux_layers)?;
        }
        self.record_logits(graph, buffers, shape);
        Ok(())
    }

    /// Token embeddings into the residual stream, and the rotary tables of the positions.
    fn record_embedding(&self, graph: &mut Graph, b: &LlamaBuffers, n: usize) {
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        let (ids, table, out) = (
            b.inputs.token_ids.clone(),
            self.embed.clone(),
            b.residual.clone(),
        );
        graph.record("embedding", &[ids.handle(), out.handle()], move |_| {
            let ids = &ids.read()[..n];
            if let Some(id) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(refuse(format!(
                    "token id {id} outside the vocabulary of {vocab}"
                )));
            }
            embedding(ids, &table, h, &mut out.write()[..n * h]);
            Ok(())
        });
        let half = self.config.head_dim / 2;
        let (pos, cos, sin) = (b.inputs.positions.clone(), b.cos.clone(), b.sin.clone());
        let rotary = self.rotary.clone();
        let handles = [pos.handle(), cos.handle(), sin.handle()];
        graph.record("rotary_tables", &handles, move |_| {
            let (mut c, mut s) = (cos.write(), sin.write());
            rotary.tables_into(&pos.read()[..n], &mut c[..n * half], &mut s[..n * half]);
            Ok(())
        });
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
        let c = &self.config;
        let n = shape.rows;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let (res, normed, delta) = (b.residual.clone(), b.normed.clone(), b.delta.clone());
        let ly = layer.clone();
        let handles = [res.handle(), delta.handle(), normed.handle()];
        graph.record("input_norm", &handles, move |_| {
            let out = &mut normed.write()[..n * h];
            if l == 0 {
                ly.input_norm.forward(&res.read()[..n * h], out);
            } else {
                let delta = &delta.read()[..n * h];
                ly.input_norm
                    .forward_residual(&mut res.write()[..n * h], delta, out);
            }
            Ok(())
        });
        self.record_aux(graph, b, n, l, aux_layers);
        linear(graph, "qkv", layer, |ly| &ly.qkv, &b.normed, &b.qkv, n);
        let (qkv, q, k, v) = (b.qkv.clone(), b.q.clone(), b.k.clone(), b.v.clone());
        let handles = [qkv.handle(), q.handle(), k.handle(), v.handle()];
        graph.record("split_qkv", &handles, move |_| {
            let (mut q, mut k, mut v) = (q.write(), k.write(), v.write());
            for (r, row) in qkv.read()[..n * (qd + 2 * kvd)]
                .chunks(qd + 2 * kvd)
                .enumerate()
            {
                q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
            }
            Ok(())
        });
        let (q, k, cos, sin) = (b.q.clone(), b.k.clone(), b.cos.clone(), b.sin.clone());
        let (ly, rotary) = (layer.clone(), self.rotary.clone());
        let half = d / 2;
        let handles = [q.handle(), k.handle(), cos.handle(), sin.handle()];
        graph.record("qk_norm_rope", &handles, move |_| {
            let (mut q, mut k) = (q.write(), k.write());
            let (q, k) = (&mut q[..n * qd], &mut k[..n * kvd]);
            if let (Some(qn), Some(kn)) = (&ly.q_norm, &ly.k_norm) {
                qn.forward_in_place(q);
                kn.forward_in_place(k);
            }
            let (cos, sin) = (&cos.read()[..n * half], &sin.read()[..n * half]);
            rotary.apply_with(q, cos, sin);
            rotary.apply_with(k, cos, sin);
            Ok(())
        });
        let (k, v, slots) = (b.k.clone(), b.v.clone(), b.inputs.slot_mapping.clone());
        graph.record(
            "write_kv",
            &[k.handle(), v.handle(), slots.handle()],
            move |cache| {
                let slots = &slots.read()[..n];
                let layout = cache.layout();
                let total = layout.num_blocks * layout.block_size;
                if let Some(slot) = slots.iter().find(|&&s| s >= 0 && s as u64 >= total) {
                    return Err(refuse(format!(
                        "slot {slot} outside the pool's {total} slots"
                    )));
                }
                cache.write(l, slots, &k.read()[..n * kvd], &v.read()[..n * kvd]);
                Ok(())
            },
        );
        self.record_attention(graph, b, shape, l)?;
        linear(
            graph,
            "o_proj",
            layer,
            |ly| &ly.o_proj,
            &b.attn,
            &b.delta,
            n,
        );
        let (res, normed, delta) = (b.residual.clone(), b.normed.clone(), b.delta.clone());
        let ly = layer.clone();
        let handles = [res.handle(), delta.handle(), normed.handle()];
        graph.record("post_norm", &handles, move |_| {
            let (delta, out) = (&delta.read()[..n * h], &mut normed.write()[..n * h]);
            ly.post_norm
                .forward_residual(&mut res.write()[..n * h], delta, out);
            Ok(())
        });
        linear(
            graph,
            "gate_up",
            layer,
            |ly| &ly.gate_up,
            &b.normed,
            &b.gate_up,
            n,
        );
        let inter = c.intermediate_size;
        let (gate_up, act) = (b.gate_up.clone(), b.act.clone());
        graph.record(
            "silu_and_mul",
            &[gate_up.handle(), act.handle()],
            move |_| {
                let gate_up = &gate_up.read()[..n * 2 * inter];
                silu_and_mul(gate_up, inter, &mut act.write()[..n * inter]);
                Ok(())
            },
        );
        linear(graph, "down", layer, |ly| &ly.down, &b.act, &b.delta, n);
        Ok(())
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
            let (res, aux) = (b.residual.clone(), b.aux.clone());
            graph.record("record_hidden", &[res.handle(), aux.handle()], move |_| {
                let mut aux = aux.write();
                for (row, out) in res.read()[..n * h].chunks(h).zip(aux.chunks_mut(width)) {
                    out[slot * h..(slot + 1) * h].copy_from_slice(row);
                }
                Ok(())
            });
        }
    }

    /// Attention over the staged metadata, planned over the real rows it holds: the most
    /// rows it can plan (the step's) are checked against q and o here, at capture, and the
    /// rows planned at each replay before the kernel runs.
    fn record_attention(
        &self,
        graph: &mut Graph,
        b: &LlamaBuffers,
        shape: StepShape,
        l: usize,
    ) -> Result<(), ForwardError> {
        let (n, seqs) = (shape.rows, shape.seqs);
        let qd = self.config.num_heads * self.config.head_dim;
        AttentionPlan::check_rows(n, b.q.len() / qd, b.attn.len() / qd)?;
        let i = &b.inputs;
        let (starts, lens, tables) = (
            i.query_start.clone(),
            i.seq_lens.clone(),
            i.block_tables.clone(),
        );
        let (q, attn, attention, max_blocks) =
            (b.q.clone(), b.attn.clone(), self.attention, i.max_blocks);
        let handles = [
            q.handle(),
            attn.handle(),
            starts.handle(),
            lens.handle(),
            tables.handle(),
        ];
        graph.record("paged_attention", &handles, move |cache| {
            let (starts, lens, tables) = (starts.read(), lens.read(), tables.read());
            let meta = StagedMeta {
                query_start: &starts[..seqs + 1],
                seq_lens: &lens[..seqs],
                block_tables: &tables[..seqs * max_blocks],
                max_blocks,
            };
            let (q, o) = (&q.read()[..n * qd], &mut attn.write()[..n * qd]);
            Ok(attention.forward_staged(q, o, cache, l, &meta)?)
        });
        Ok(())
    }

    /// The last layer's output into the residual, then the logits of the logit rows: the
    /// rows picked, the final norm, the head.
    fn record_logits(&self, graph: &mut Graph, b: &LlamaBuffers, shape: StepShape) {
        let (n, r) = (shape.rows, shape.logit_rows);
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        let (res, delta, rows, picked) = (
            b.residual.clone(),
            b.delta.clone(),
            b.inputs.logit_rows.clone(),
            b.picked.clone(),
        );
        let handles = [res.handle(), delta.handle(), rows.handle(), picked.handle()];
        graph.record("final_residual", &handles, move |_| {
            let mut res = res.write();
            res[..n * h]
                .iter_mut()
                .zip(&delta.read()[..n * h])
                .for_each(|(x, d)| *x += d);
            let mut picked = picked.write();
            for (out, &row) in picked[..r * h].chunks_mut(h).zip(&rows.read()[..r]) {
                let row = row as usize;
                if row >= n {
                    return Err(refuse(format!("logit row {row} of a step of {n} rows")));
                }
                out.copy_from_slice(&res[row * h..(row + 1) * h]);
            }
            Ok(())
        });
        let (picked, normed, norm) = (b.picked.clone(), b.picked_normed.clone(), self.norm.clone());
        graph.record(
            "final_norm",
            &[picked.handle(), normed.handle()],
            move |_| {
                norm.forward(&picked.read()[..r * h], &mut normed.write()[..r * h]);
                Ok(())
            },
        );
        let (normed, logits, head) = (
            b.picked_normed.clone(),
            b.logits.clone(),
            self.lm_head.clone(),
        );
        graph.record("lm_head", &[normed.handle(), logits.handle()], move |_| {
            head.forward(&normed.read()[..r * h], &mut logits.write()[..r * vocab]);
            Ok(())
        });
    }
}

/// Records `x · Wᵀ` for the first `n` rows, with `W` the layer's linear `which` picks.
fn linear(
    graph: &mut Graph,
    name: &'static str,
    layer: &Arc<Layer>,
    which: fn(&Layer) -> &peregrine_ops::Linear,
    x: &CpuBuffer<f32>,
    out: &CpuBuffer<f32>,
    n: usize,
) {
    let (ly, x, out) = (layer.clone(), x.clone(), out.clone());
    graph.record(name, &[x.handle(), out.handle()], move |_| {
        let w = which(&ly);
        let (k, m) = (w.in_features(), w.out_features());
        w.forward(&x.read()[..n * k], &mut out.write()[..n * m]);
        Ok(())
    });
}
