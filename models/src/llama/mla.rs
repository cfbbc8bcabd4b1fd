//! Multi-head latent attention (DeepSeek-V2/V3) on the CPU, absorbed for every step: the
//! cache keeps one row a token, the normed latent and the rotated key, `[c | k_pe]`; each
//! head's query is taken into the latent's space by `W_UK` before attention, and the
//! attention's latent output out of it by `W_UV` after (as vLLM absorbs them in
//! `process_weights_after_loading`).

use crate::config::{MlaConfig, ModelConfig};
use crate::graph::cpu::ops::{linear, refuse, staged_attention, Activations, Graph};
use crate::graph::cpu::step_io::{StepInputs, StepShape};
use crate::weights::{WeightError, Weights};
use crate::ForwardError;
use peregrine_kernels::cpu::Matrix;
use peregrine_ops::{Linear, MlaAttention, RmsNorm, Rotary};
use peregrine_runtime::cpu::{BufferPool, CpuBuffer};
use std::sync::Arc;

/// One layer's latent-attention weights.
pub(crate) struct MlaWeights {
    /// The query's projection (`q_proj`, or `q_a_proj` under `q_lora_rank`) stacked over
    /// `kv_a_proj_with_mqa`: both read the normed input.
    qkv_a: Linear,
    /// `q_a_layernorm` and `q_b_proj`, under `q_lora_rank`.
    q_b: Option<(RmsNorm, Linear)>,
    /// `kv_a_layernorm`, over the latent.
    kv_a_norm: RmsNorm,
    /// Each head's `W_UKᵀ`, `[latent, qk_nope]`: its query's absorption.
    uk: Vec<Linear>,
    /// Each head's `W_UV`, `[v_head_dim, latent]`: its output's expansion.
    uv: Vec<Linear>,
    o_proj: Linear,
}

impl MlaWeights {
    /// Layer `prefix`'s weights, every shape checked.
    pub fn load(w: &Weights, c: &ModelConfig, prefix: &str) -> Result<MlaWeights, WeightError> {
        let m = mla(c);
        let (h, heads, eps) = (c.hidden_size, c.num_heads, c.rms_norm_eps as f32);
        let (l, r, p, v) = (
            m.kv_lora_rank,
            m.qk_rope_head_dim,
            m.qk_nope_head_dim,
            m.v_head_dim,
        );
        let name = |n: &str| format!("{prefix}.self_attn.{n}");
        let matrix = |n: &str, shape| w.matrix(&name(n), shape);
        let q_out = heads * (p + r);
        let (q_first, q_b) = match m.q_lora_rank {
            None => (matrix("q_proj.weight", [q_out, h])?, None),
            Some(rank) => {
                let norm = RmsNorm::new(w.f32(&name("q_a_layernorm.weight"), &[rank])?, eps);
                let q_b = matrix("q_b_proj.weight", [q_out, rank])?;
                let q_b = (norm, Linear::of(Arc::new(q_b), None));
                (matrix("q_a_proj.weight", [rank, h])?, Some(q_b))
            }
        };
        let kv_a = matrix("kv_a_proj_with_mqa.weight", [l + r, h])?;
        let qkv_a = Matrix::stack(vec![q_first, kv_a]).map_err(|source| WeightError::Matrix {
            name: name("kv_a_proj_with_mqa.weight"),
            source,
        })?;
        // kv_b_proj: each head's rows are W_UK (qk_nope rows) then W_UV (v rows), over the
        // latent.
        let kv_b = matrix("kv_b_proj.weight", [heads * (p + v), l])?.to_f32();
        let head_rows = |head: usize, skip: usize, take: usize| {
            &kv_b[(head * (p + v) + skip) * l..(head * (p + v) + skip + take) * l]
        };
        let f32_linear = |values: Vec<f32>, cols: usize| {
            let m = Matrix::f32(values.into(), cols).expect("a whole number of rows");
            Linear::of(Arc::new(m), None)
        };
        let uk = (0..heads)
            .map(|head| {
                let rows = head_rows(head, 0, p);
                let transposed = (0..l)
                    .flat_map(|j| (0..p).map(move |i| rows[i * l + j]))
                    .collect();
                f32_linear(transposed, p)
            })
            .collect();
        let uv = (0..heads)
            .map(|head| f32_linear(head_rows(head, p, v).to_vec(), l))
            .collect();
        Ok(MlaWeights {
            qkv_a: Linear::of(Arc::new(qkv_a), None),
            q_b,
            kv_a_norm: RmsNorm::new(w.f32(&name("kv_a_layernorm.weight"), &[l])?, eps),
            uk,
            uv,
            o_proj: Linear::of(Arc::new(matrix("o_proj.weight", [h, heads * v])?), None),
        })
    }

    /// The layer's projections as stored (for counting and naming their storage).
    pub fn linears(&self) -> Vec<&Linear> {
        let mut all = vec![&self.qkv_a, &self.o_proj];
        all.extend(self.q_b.as_ref().map(|(_, q_b)| q_b));
        all.extend(&self.uk);
        all.extend(&self.uv);
        all
    }
}

/// `q_b_proj`, which a layer under `q_lora_rank` has.
fn q_b_proj(w: &MlaWeights) -> &Linear {
    &w.q_b.as_ref().expect("q_b under q_lora_rank").1
}

/// The config's latent attention, which a latent layer's model has.
fn mla(c: &ModelConfig) -> &MlaConfig {
    c.mla
        .as_ref()
        .expect("a latent-attention layer of a model without MLA")
}

/// The activations of a latent-attention layer at the largest step they serve.
pub(crate) struct MlaActivations {
    config: MlaConfig,
    heads: usize,
    /// `[rows, q_first + latent + rope]` the stacked first projections.
    qkv_a: CpuBuffer<f32>,
    /// `[rows, q_lora_rank]` the normed compressed query (under `q_lora_rank`).
    q_a: CpuBuffer<f32>,
    /// `[rows, heads * qk_head_dim]` each head's `[q_nope | q_pe]`.
    q: CpuBuffer<f32>,
    /// `[rows, latent + rope]` the cache rows this step writes.
    rows: CpuBuffer<f32>,
    /// `[rows, heads * (latent + rope)]` each head's absorbed query and rotated `q_pe`.
    q_latent: CpuBuffer<f32>,
    /// `[rows, heads * latent]` each head's attention over the latents.
    o_latent: CpuBuffer<f32>,
    /// `[rows, heads * v_head_dim]` the heads' values, into `o_proj`.
    attn: CpuBuffer<f32>,
    /// `[rows, max(qk_nope, latent)]`, `[rows, max(latent, v_head_dim)]`: one head's
    /// input and output of its absorption or expansion.
    head_in: CpuBuffer<f32>,
    head_out: CpuBuffer<f32>,
}

impl MlaActivations {
    /// Buffers for steps up to `capacity` of a model of `c`, from `pool`.
    pub fn new(pool: &BufferPool, c: &ModelConfig, capacity: StepShape) -> MlaActivations {
        let m = mla(c).clone();
        let (n, heads) = (capacity.rows, c.num_heads);
        let (l, r) = (m.kv_lora_rank, m.qk_rope_head_dim);
        let q_out = heads * m.qk_head_dim();
        let q_first = m.q_lora_rank.unwrap_or(q_out);
        let f = |len: usize| pool.alloc::<f32>(len);
        MlaActivations {
            qkv_a: f(n * (q_first + l + r)),
            q_a: f(n * m.q_lora_rank.unwrap_or(0)),
            q: f(n * q_out),
            rows: f(n * (l + r)),
            q_latent: f(n * heads * (l + r)),
            o_latent: f(n * heads * l),
            attn: f(n * heads * m.v_head_dim),
            head_in: f(n * m.qk_nope_head_dim.max(l)),
            head_out: f(n * l.max(m.v_head_dim)),
            heads,
            config: m,
        }
    }
}

/// Records layer `layer`'s latent attention of the first `shape.rows` rows of `a.normed`
/// into `a.delta`: projections, the cache rows written at the staged slots, attention over
/// the staged metadata (planned rows checked against q and o), `W_UV` and `o_proj`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    graph: &mut Graph,
    inputs: &StepInputs,
    a: &Activations,
    m: &MlaActivations,
    w: &Arc<MlaWeights>,
    rotary: &Arc<Rotary>,
    shape: StepShape,
    layer: usize,
) -> Result<(), ForwardError> {
    let n = shape.rows;
    let c = &m.config;
    let (heads, l, r, p) = (
        m.heads,
        c.kv_lora_rank,
        c.qk_rope_head_dim,
        c.qk_nope_head_dim,
    );
    let qk = c.qk_head_dim();
    let q_first = c.q_lora_rank.unwrap_or(heads * qk);
    let stride = q_first + l + r;
    linear(graph, "mla_qkv_a", w, |w| &w.qkv_a, &a.normed, &m.qkv_a, n);
    // The query: taken as it is, or through q_a_layernorm and q_b_proj.
    if let Some(rank) = c.q_lora_rank {
        let (qkv_a, q_a, w2) = (m.qkv_a.clone(), m.q_a.clone(), w.clone());
        graph.record("mla_q_a_norm", &[qkv_a.handle(), q_a.handle()], move |_| {
            let (src, mut q_a) = (qkv_a.read(), q_a.write());
            let norm = &w2.q_b.as_ref().expect("q_b under q_lora_rank").0;
            for (row, out) in src[..n * stride].chunks(stride).zip(q_a.chunks_mut(rank)) {
                norm.forward(&row[..rank], out);
            }
            Ok(())
        });
        linear(graph, "mla_q_b", w, q_b_proj, &m.q_a, &m.q, n);
    } else {
        let (qkv_a, q) = (m.qkv_a.clone(), m.q.clone());
        graph.record("mla_q", &[qkv_a.handle(), q.handle()], move |_| {
            let (src, mut q) = (qkv_a.read(), q.write());
            for (row, out) in src[..n * stride].chunks(stride).zip(q.chunks_mut(q_first)) {
                out.copy_from_slice(&row[..q_first]);
            }
            Ok(())
        });
    }
    // The cache rows: the normed latent, then the rotated key.
    let (qkv_a, rows, cos, sin) = (
        m.qkv_a.clone(),
        m.rows.clone(),
        a.cos.clone(),
        a.sin.clone(),
    );
    let (w2, rot) = (w.clone(), rotary.clone());
    let handles = [qkv_a.handle(), rows.handle(), cos.handle(), sin.handle()];
    graph.record("mla_latent_rows", &handles, move |_| {
        let (src, mut rows) = (qkv_a.read(), rows.write());
        let (cos, sin) = (cos.read(), sin.read());
        for (t, (row, out)) in src[..n * stride]
            .chunks(stride)
            .zip(rows.chunks_mut(l + r))
            .enumerate()
        {
            w2.kv_a_norm
                .forward(&row[q_first..q_first + l], &mut out[..l]);
            out[l..].copy_from_slice(&row[q_first + l..]);
            let half = r / 2;
            let (cos, sin) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            rot.apply_with(&mut out[l..], cos, sin);
        }
        Ok(())
    });
    let (rows, slots) = (m.rows.clone(), inputs.slot_mapping.clone());
    graph.record(
        "mla_write_cache",
        &[rows.handle(), slots.handle()],
        move |cache| {
            let slots = &slots.read()[..n];
            let layout = cache.layout();
            let total = layout.num_blocks * layout.block_size;
            if let Some(slot) = slots.iter().find(|&&s| s >= 0 && s as u64 >= total) {
                return Err(refuse(format!(
                    "slot {slot} outside the pool's {total} slots"
                )));
            }
            cache.write_latent(layer, slots, &rows.read()[..n * (l + r)]);
            Ok(())
        },
    );
    // Each head's query: its rotary part rotated, its other part absorbed by W_UKᵀ.
    let (q, q_latent, cos, sin) = (
        m.q.clone(),
        m.q_latent.clone(),
        a.cos.clone(),
        a.sin.clone(),
    );
    let (head_in, head_out, w2, rot) = (
        m.head_in.clone(),
        m.head_out.clone(),
        w.clone(),
        rotary.clone(),
    );
    let handles = [
        q.handle(),
        q_latent.handle(),
        cos.handle(),
        sin.handle(),
        head_in.handle(),
        head_out.handle(),
    ];
    graph.record("mla_absorb_q", &handles, move |_| {
        let (q, mut ql) = (q.read(), q_latent.write());
        let (mut hin, mut hout) = (head_in.write(), head_out.write());
        let (cos, sin) = (cos.read(), sin.read());
        let half = r / 2;
        for h in 0..heads {
            for t in 0..n {
                let src = &q[(t * heads + h) * qk..][..qk];
                hin[t * p..(t + 1) * p].copy_from_slice(&src[..p]);
                let pe = &mut ql[(t * heads + h) * (l + r) + l..][..r];
                pe.copy_from_slice(&src[p..]);
                rot.apply_with(pe, &cos[t * half..][..half], &sin[t * half..][..half]);
            }
            w2.uk[h].forward(&hin[..n * p], &mut hout[..n * l]);
            for t in 0..n {
                let dst = &mut ql[(t * heads + h) * (l + r)..][..l];
                dst.copy_from_slice(&hout[t * l..(t + 1) * l]);
            }
        }
        Ok(())
    });
    attention(graph, inputs, m, c, shape, layer)?;
    // Each head's latent output expanded by W_UV, then o_proj.
    let (o_latent, attn, head_in, head_out, w2) = (
        m.o_latent.clone(),
        m.attn.clone(),
        m.head_in.clone(),
        m.head_out.clone(),
        w.clone(),
    );
    let v = c.v_head_dim;
    let handles = [
        o_latent.handle(),
        attn.handle(),
        head_in.handle(),
        head_out.handle(),
    ];
    graph.record("mla_expand_values", &handles, move |_| {
        let (ol, mut attn) = (o_latent.read(), attn.write());
        let (mut hin, mut hout) = (head_in.write(), head_out.write());
        for h in 0..heads {
            for t in 0..n {
                hin[t * l..(t + 1) * l].copy_from_slice(&ol[(t * heads + h) * l..][..l]);
            }
            w2.uv[h].forward(&hin[..n * l], &mut hout[..n * v]);
            for t in 0..n {
                attn[(t * heads + h) * v..][..v].copy_from_slice(&hout[t * v..(t + 1) * v]);
            }
        }
        Ok(())
    });
    linear(graph, "mla_o_proj", w, |w| &w.o_proj, &m.attn, &a.delta, n);
    Ok(())
}

/// The latent attention over the staged metadata, planned over the real rows: the step's
/// rows are checked against q and o here, at capture, and the planned rows at each replay.
fn attention(
    graph: &mut Graph,
    inputs: &StepInputs,
    m: &MlaActivations,
    c: &MlaConfig,
    shape: StepShape,
    layer: usize,
) -> Result<(), ForwardError> {
    let (heads, l) = (m.heads, c.kv_lora_rank);
    let op = MlaAttention {
        num_heads: heads,
        latent: l,
        scale: c.softmax_scale as f32,
    };
    let rows = (&m.q_latent, heads * c.cache_width(), &m.o_latent, heads * l);
    staged_attention(
        graph,
        "mla_attention",
        inputs,
        rows,
        shape,
        move |q, o, cache, meta| op.forward_staged(q, o, cache, layer, meta),
    )
}
