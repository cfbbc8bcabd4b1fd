//! The recorded ops a decoder forward is built of, shared by the Llama forward and the
//! EAGLE-3 head's: each records one kernel call over pooled buffers into a [`CpuGraph`],
//! holding owning handles of every buffer it touches and reading the staged inputs at
//! replay.

use crate::graph::cpu::step_io::{StepInputs, StepShape};
use crate::ForwardError;
use peregrine_kernels::cpu::embedding as embed_rows;
use peregrine_kernels::cpu::silu_and_mul as silu_mul;
use peregrine_kernels::cpu::Matrix;
use peregrine_ops::{
    AttentionPlan, KvCache, Linear, PagedAttention, PlanError, RmsNorm, Rotary, StagedMeta,
};
use peregrine_runtime::cpu::{BufferPool, CpuBuffer, CpuGraph, OpError};
use std::sync::Arc;

/// A graph of a forward, run against the KV cache.
pub(crate) type Graph = CpuGraph<KvCache>;

/// A value an op refuses, as its error.
pub(crate) fn refuse(message: String) -> OpError {
    message.into()
}

/// The widths of one decoder layer's activations.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    /// The residual stream's width.
    pub hidden: usize,
    /// One head's width.
    pub head_dim: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// The MLP's inner width.
    pub intermediate: usize,
}

/// The activations of one decoder layer and of its logit rows, at the largest step they
/// serve.
pub(crate) struct Activations {
    pub dims: Dims,
    pub residual: CpuBuffer<f32>,
    pub normed: CpuBuffer<f32>,
    pub delta: CpuBuffer<f32>,
    pub qkv: CpuBuffer<f32>,
    pub q: CpuBuffer<f32>,
    pub k: CpuBuffer<f32>,
    pub v: CpuBuffer<f32>,
    pub attn: CpuBuffer<f32>,
    pub gate_up: CpuBuffer<f32>,
    pub act: CpuBuffer<f32>,
    pub cos: CpuBuffer<f32>,
    pub sin: CpuBuffer<f32>,
    pub picked: CpuBuffer<f32>,
    pub picked_normed: CpuBuffer<f32>,
}

impl Activations {
    /// Activations of `dims` for steps up to `capacity`, from `pool`.
    pub fn new(pool: &BufferPool, dims: Dims, capacity: StepShape) -> Activations {
        let (n, r) = (capacity.rows, capacity.logit_rows);
        let (h, d, inter) = (dims.hidden, dims.head_dim, dims.intermediate);
        let (qd, kvd) = (dims.heads * d, dims.kv_heads * d);
        let f = |len: usize| pool.alloc::<f32>(len);
        Activations {
            dims,
            residual: f(n * h),
            normed: f(n * h),
            delta: f(n * h),
            qkv: f(n * (qd + 2 * kvd)),
            q: f(n * qd),
            k: f(n * kvd),
            v: f(n * kvd),
            attn: f(n * qd),
            gate_up: f(n * 2 * inter),
            act: f(n * inter),
            cos: f(n * d / 2),
            sin: f(n * d / 2),
            picked: f(r * h),
            picked_normed: f(r * h),
        }
    }

    fn q_dim(&self) -> usize {
        self.dims.heads * self.dims.head_dim
    }

    fn kv_dim(&self) -> usize {
        self.dims.kv_heads * self.dims.head_dim
    }
}

/// Embeds the first `n` staged token ids (rows of `h` of `table`) into `out`, refusing an
/// id outside the table.
pub(crate) fn embedding(
    graph: &mut Graph,
    inputs: &StepInputs,
    table: &Arc<Matrix>,
    out: &CpuBuffer<f32>,
    n: usize,
    h: usize,
) {
    let (ids, table, out) = (inputs.token_ids.clone(), table.clone(), out.clone());
    let vocab = table.rows();
    graph.record("embedding", &[ids.handle(), out.handle()], move |_| {
        let ids = &ids.read()[..n];
        if let Some(id) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(refuse(format!(
                "token id {id} outside the vocabulary of {vocab}"
            )));
        }
        embed_rows(ids, &table, &mut out.write()[..n * h]);
        Ok(())
    });
}

/// The rotary tables of the first `n` staged positions.
pub(crate) fn rotary_tables(
    graph: &mut Graph,
    inputs: &StepInputs,
    a: &Activations,
    rotary: &Arc<Rotary>,
    n: usize,
) {
    let half = a.dims.head_dim / 2;
    let (pos, cos, sin) = (inputs.positions.clone(), a.cos.clone(), a.sin.clone());
    let rotary = rotary.clone();
    let handles = [pos.handle(), cos.handle(), sin.handle()];
    graph.record("rotary_tables", &handles, move |_| {
        let (mut c, mut s) = (cos.write(), sin.write());
        rotary.tables_into(&pos.read()[..n], &mut c[..n * half], &mut s[..n * half]);
        Ok(())
    });
}

/// Records `x · Wᵀ` for the first `n` rows, with `W` the linear `which` picks of `w`.
pub(crate) fn linear<W: Send + Sync + 'static>(
    graph: &mut Graph,
    name: &'static str,
    w: &Arc<W>,
    which: fn(&W) -> &Linear,
    x: &CpuBuffer<f32>,
    out: &CpuBuffer<f32>,
    n: usize,
) {
    let (w, x, out) = (w.clone(), x.clone(), out.clone());
    graph.record(name, &[x.handle(), out.handle()], move |_| {
        let lin = which(&w);
        let (k, m) = (lin.in_features(), lin.out_features());
        lin.forward(&x.read()[..n * k], &mut out.write()[..n * m]);
        Ok(())
    });
}

/// Splits the first `n` rows of the fused `qkv` into `q`, `k` and `v`.
pub(crate) fn split_qkv(graph: &mut Graph, a: &Activations, n: usize) {
    let (qd, kvd) = (a.q_dim(), a.kv_dim());
    let (qkv, q, k, v) = (a.qkv.clone(), a.q.clone(), a.k.clone(), a.v.clone());
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
}

/// The per-head norms of q and k that `norms` picks of `w` (if any), then rotary
/// embedding of the first `n` rows of q and k.
pub(crate) fn qk_norm_rope<W: Send + Sync + 'static>(
    graph: &mut Graph,
    a: &Activations,
    rotary: &Arc<Rotary>,
    w: &Arc<W>,
    norms: fn(&W) -> Option<(&RmsNorm, &RmsNorm)>,
    n: usize,
) {
    let (qd, kvd, half) = (a.q_dim(), a.kv_dim(), a.dims.head_dim / 2);
    let (q, k, cos, sin) = (a.q.clone(), a.k.clone(), a.cos.clone(), a.sin.clone());
    let (w, rotary) = (w.clone(), rotary.clone());
    let handles = [q.handle(), k.handle(), cos.handle(), sin.handle()];
    graph.record("qk_norm_rope", &handles, move |_| {
        let (mut q, mut k) = (q.write(), k.write());
        let (q, k) = (&mut q[..n * qd], &mut k[..n * kvd]);
        if let Some((qn, kn)) = norms(&w) {
            qn.forward_in_place(q);
            kn.forward_in_place(k);
        }
        let (cos, sin) = (&cos.read()[..n * half], &sin.read()[..n * half]);
        rotary.apply_with(q, cos, sin);
        rotary.apply_with(k, cos, sin);
        Ok(())
    });
}

/// Writes the first `n` rows of k and v into layer `layer` of the cache at the staged
/// slots, refusing a slot outside the pool.
pub(crate) fn write_kv(
    graph: &mut Graph,
    inputs: &StepInputs,
    a: &Activations,
    n: usize,
    layer: usize,
) {
    let kvd = a.kv_dim();
    let (k, v, slots) = (a.k.clone(), a.v.clone(), inputs.slot_mapping.clone());
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
            cache.write(layer, slots, &k.read()[..n * kvd], &v.read()[..n * kvd]);
            Ok(())
        },
    );
}

/// Attention of layer `layer` over the staged metadata, planned over the real rows it
/// holds: the most rows it can plan (the step's) are checked against q and o here, at
/// capture, and the rows planned at each replay before the kernel runs.
pub(crate) fn attention(
    graph: &mut Graph,
    inputs: &StepInputs,
    a: &Activations,
    attention: PagedAttention,
    shape: StepShape,
    layer: usize,
) -> Result<(), ForwardError> {
    let qd = a.q_dim();
    let rows = (&a.q, qd, &a.attn, qd);
    staged_attention(
        graph,
        "paged_attention",
        inputs,
        rows,
        shape,
        move |q, o, cache, meta| attention.forward_staged(q, o, cache, layer, meta),
    )
}

/// Records an attention op `run` of the first `shape.rows` rows of `q` (rows of `q_width`)
/// into `o` (rows of `o_width`) over the staged metadata of `shape.seqs` sequences: the
/// step's rows are checked against q and o at capture; `run` checks the rows planned at
/// each replay before its kernel runs.
pub(crate) fn staged_attention(
    graph: &mut Graph,
    name: &'static str,
    inputs: &StepInputs,
    (q, q_width, o, o_width): (&CpuBuffer<f32>, usize, &CpuBuffer<f32>, usize),
    shape: StepShape,
    run: impl Fn(&[f32], &mut [f32], &KvCache, &StagedMeta) -> Result<(), PlanError>
        + Send
        + Sync
        + 'static,
) -> Result<(), ForwardError> {
    let (n, seqs) = (shape.rows, shape.seqs);
    AttentionPlan::check_rows(n, q.len() / q_width, o.len() / o_width)?;
    let (starts, lens, tables) = (
        inputs.query_start.clone(),
        inputs.seq_lens.clone(),
        inputs.block_tables.clone(),
    );
    let (q, o, max_blocks) = (q.clone(), o.clone(), inputs.max_blocks);
    let handles = [
        q.handle(),
        o.handle(),
        starts.handle(),
        lens.handle(),
        tables.handle(),
    ];
    graph.record(name, &handles, move |cache| {
        let (starts, lens, tables) = (starts.read(), lens.read(), tables.read());
        let meta = StagedMeta {
            query_start: &starts[..seqs + 1],
            seq_lens: &lens[..seqs],
            block_tables: &tables[..seqs * max_blocks],
            max_blocks,
        };
        let (q, o) = (&q.read()[..n * q_width], &mut o.write()[..n * o_width]);
        Ok(run(q, o, cache, &meta)?)
    });
    Ok(())
}

/// The residual plus delta, normed by the norm `which` picks of `w`, into `normed` (the
/// residual keeps the sum), for the first `n` rows.
pub(crate) fn add_norm<W: Send + Sync + 'static>(
    graph: &mut Graph,
    name: &'static str,
    a: &Activations,
    w: &Arc<W>,
    which: fn(&W) -> &RmsNorm,
    n: usize,
) {
    let h = a.dims.hidden;
    let (res, normed, delta) = (a.residual.clone(), a.normed.clone(), a.delta.clone());
    let w = w.clone();
    let handles = [res.handle(), delta.handle(), normed.handle()];
    graph.record(name, &handles, move |_| {
        let (delta, out) = (&delta.read()[..n * h], &mut normed.write()[..n * h]);
        which(&w).forward_residual(&mut res.write()[..n * h], delta, out);
        Ok(())
    });
}

/// `silu(gate) * up` of the first `n` rows of `gate_up` into `act`.
pub(crate) fn silu_and_mul(graph: &mut Graph, a: &Activations, n: usize) {
    let inter = a.dims.intermediate;
    let (gate_up, act) = (a.gate_up.clone(), a.act.clone());
    graph.record(
        "silu_and_mul",
        &[gate_up.handle(), act.handle()],
        move |_| {
            let gate_up = &gate_up.read()[..n * 2 * inter];
            silu_mul(gate_up, inter, &mut act.write()[..n * inter]);
            Ok(())
        },
    );
}

/// The last delta into the residual, then the logits of the staged logit rows into `out`
/// (`[logit_rows, vocab]`): the rows picked, the final `norm`, the `head`.
pub(crate) fn logits(
    graph: &mut Graph,
    inputs: &StepInputs,
    a: &Activations,
    norm: &Arc<RmsNorm>,
    head: &Arc<Linear>,
    out: &CpuBuffer<f32>,
    shape: StepShape,
) {
    let (n, r) = (shape.rows, shape.logit_rows);
    let (h, vocab) = (a.dims.hidden, head.out_features());
    let (res, delta, rows, picked) = (
        a.residual.clone(),
        a.delta.clone(),
        inputs.logit_rows.clone(),
        a.picked.clone(),
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
    let (picked, normed, norm) = (a.picked.clone(), a.picked_normed.clone(), norm.clone());
    graph.record(
        "final_norm",
        &[picked.handle(), normed.handle()],
        move |_| {
            norm.forward(&picked.read()[..r * h], &mut normed.write()[..r * h]);
            Ok(())
        },
    );
    let (normed, out, head) = (a.picked_normed.clone(), out.clone(), head.clone());
    graph.record("lm_head", &[normed.handle(), out.handle()], move |_| {
        head.forward(&normed.read()[..r * h], &mut out.write()[..r * vocab]);
        Ok(())
    });
}
