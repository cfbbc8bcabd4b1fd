//! Latent attention (DeepSeek-V2/V3's MLA) in the GPU forward, absorbed for every step as
//! on the CPU (`llama/mla.rs`): the first projections, each head's query taken into the
//! latent's space by its `W_UK` (one batched product over the heads), the rotary parts and
//! the step's cache rows (`mla_prepare`), the paged latent attention over the plan's rows
//! (every sequence cut into one-row sequences, so prefill rows run as the decode rows they
//! would be), each head's output expanded by its `W_UV` (batched) and `o_proj`.

use super::step::LayerStep;
use super::upload::{to_device, GpuWeightError, RandomWeights};
use super::GpuForwardError;
use crate::config::{MlaConfig, ModelConfig};
use crate::weights::Weights;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::bf16;
use peregrine_kernels::cpu::KvLayout;
use peregrine_kernels::cuda::gemm::{BatchedShape, Strided, WeightLayout};
use peregrine_kernels::cuda::mla::MlaProjections;
use peregrine_kernels::cuda::norm::rms_norm_rows;
use peregrine_ops::cuda::mla::GpuMlaAttention;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// One layer's latent-attention weights on the device, bf16.
pub struct GpuLatent {
    /// The query's first projection (`q_proj`, or `q_a_proj` under `q_lora_rank`) stacked
    /// over `kv_a_proj_with_mqa`: `[q_first + latent + rope, hidden]`.
    pub qkv_a: CudaSlice<bf16>,
    /// `q_a_layernorm` (`[q_lora_rank]`) and `q_b_proj` (`[heads * qk_head_dim, rank]`).
    pub q_b: Option<(CudaSlice<bf16>, CudaSlice<bf16>)>,
    /// `kv_a_layernorm`, `[latent]`.
    pub kv_norm: CudaSlice<bf16>,
    /// `kv_b_proj` as stored, `[heads * (qk_nope + v_head_dim), latent]`: each head's
    /// `W_UK` rows then its `W_UV` rows, read in place by the batched products.
    pub kv_b: CudaSlice<bf16>,
    /// `[hidden, heads * v_head_dim]`.
    pub o_proj: CudaSlice<bf16>,
}

/// The config's latent attention, which a latent layer's model has.
fn mla(c: &ModelConfig) -> &MlaConfig {
    c.mla
        .as_ref()
        .expect("a latent layer of a model without MLA")
}

/// Columns of the query's first projection: the query itself, or its compression.
fn q_first(c: &ModelConfig) -> usize {
    let m = mla(c);
    m.q_lora_rank.unwrap_or(c.num_heads * m.qk_head_dim())
}

impl GpuLatent {
    /// Layer `prefix`'s weights (`{prefix}.self_attn.*`), every shape checked.
    pub fn load(
        gpu: &Gpu,
        c: &ModelConfig,
        w: &Weights,
        prefix: &str,
    ) -> Result<GpuLatent, GpuWeightError> {
        let m = mla(c);
        let (h, heads) = (c.hidden_size, c.num_heads);
        let (l, r, p, v) = (
            m.kv_lora_rank,
            m.qk_rope_head_dim,
            m.qk_nope_head_dim,
            m.v_head_dim,
        );
        let get = |n: &str, shape: &[usize]| w.f32(&format!("{prefix}.self_attn.{n}"), shape);
        let q_out = heads * m.qk_head_dim();
        let (mut qkv_a, q_b) = match m.q_lora_rank {
            None => (get("q_proj.weight", &[q_out, h])?, None),
            Some(rank) => {
                let norm = to_device(gpu, &get("q_a_layernorm.weight", &[rank])?)?;
                let q_b = to_device(gpu, &get("q_b_proj.weight", &[q_out, rank])?)?;
                (get("q_a_proj.weight", &[rank, h])?, Some((norm, q_b)))
            }
        };
        qkv_a.extend(get("kv_a_proj_with_mqa.weight", &[l + r, h])?);
        Ok(GpuLatent {
            qkv_a: to_device(gpu, &qkv_a)?,
            q_b,
            kv_norm: to_device(gpu, &get("kv_a_layernorm.weight", &[l])?)?,
            kv_b: to_device(gpu, &get("kv_b_proj.weight", &[heads * (p + v), l])?)?,
            o_proj: to_device(gpu, &get("o_proj.weight", &[h, heads * v])?)?,
        })
    }

    /// Random weights of `c`'s shapes (see [`RandomWeights`]).
    pub fn random(r: &mut RandomWeights, c: &ModelConfig) -> Result<GpuLatent, GpuWeightError> {
        let m = mla(c);
        let (h, heads, l) = (c.hidden_size, c.num_heads, m.kv_lora_rank);
        let (p, v) = (m.qk_nope_head_dim, m.v_head_dim);
        let rows = q_first(c) + l + m.qk_rope_head_dim;
        let q_b = match m.q_lora_rank {
            None => None,
            Some(rank) => Some((r.ones(rank)?, r.linear(heads * m.qk_head_dim(), rank)?)),
        };
        Ok(GpuLatent {
            qkv_a: r.linear(rows, h)?,
            q_b,
            kv_norm: r.ones(l)?,
            kv_b: r.linear(heads * (p + v), l)?,
            o_proj: r.linear(h, heads * v)?,
        })
    }

    /// Elements held.
    pub fn elements(&self) -> u64 {
        let q_b = self
            .q_b
            .as_ref()
            .map_or(0, |(n, q)| (n.len() + q.len()) as u64);
        (self.qkv_a.len() + self.kv_norm.len() + self.kv_b.len() + self.o_proj.len()) as u64 + q_b
    }
}

/// The activations of a latent layer for up to `max_tokens` rows.
pub struct LatentBuffers {
    /// `[tokens, q_first + latent + rope]` the stacked first projections.
    pub qkv_a: CudaSlice<bf16>,
    /// `[tokens, q_lora_rank]` the normed compressed query (empty without one).
    pub q_a: CudaSlice<bf16>,
    /// `[tokens, heads * qk_head_dim]` the query under `q_lora_rank` (empty without one:
    /// the query is then read from `qkv_a`).
    pub q: CudaSlice<bf16>,
    /// `[tokens, heads, latent + rope]` each head's absorbed and rotary query.
    pub q_lat: CudaSlice<bf16>,
    /// `[tokens, heads, latent]` each head's attention over the latents.
    pub o_lat: CudaSlice<bf16>,
    /// `[tokens, heads * v_head_dim]` the heads' values, into `o_proj`.
    pub attn: CudaSlice<bf16>,
}

/// Elements per token of each [`LatentBuffers`] buffer, in field order.
fn widths(c: &ModelConfig) -> [usize; 6] {
    let m = mla(c);
    let (heads, l, r) = (c.num_heads, m.kv_lora_rank, m.qk_rope_head_dim);
    let under_lora = |w: usize| if m.q_lora_rank.is_some() { w } else { 0 };
    [
        q_first(c) + l + r,
        m.q_lora_rank.unwrap_or(0),
        under_lora(heads * m.qk_head_dim()),
        heads * (l + r),
        heads * l,
        heads * m.v_head_dim,
    ]
}

impl LatentBuffers {
    /// Buffers for `max_tokens` rows of model `c` (which has latent attention).
    pub fn new(gpu: &Gpu, c: &ModelConfig, max_tokens: usize) -> Result<LatentBuffers, GpuError> {
        let [qkv_a, q_a, q, q_lat, o_lat, attn] = widths(c).map(|w| w * max_tokens);
        // Empty buffers still take one element: a zero-sized allocation is refused.
        let alloc = |len: usize| gpu.zeros::<bf16>(len.max(1));
        Ok(LatentBuffers {
            qkv_a: alloc(qkv_a)?,
            q_a: alloc(q_a)?,
            q: alloc(q)?,
            q_lat: alloc(q_lat)?,
            o_lat: alloc(o_lat)?,
            attn: alloc(attn)?,
        })
    }

    /// Device bytes [`LatentBuffers::new`] allocates for `max_tokens` rows of `c`.
    pub fn bytes_for(c: &ModelConfig, max_tokens: usize) -> u64 {
        let per_token: usize = widths(c).iter().sum();
        2 * (per_token as u64).saturating_mul(max_tokens as u64)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        let all = [
            &self.qkv_a,
            &self.q_a,
            &self.q,
            &self.q_lat,
            &self.o_lat,
            &self.attn,
        ];
        all.iter().map(|s| 2 * s.len() as u64).sum()
    }
}

/// Queues the latent attention of the `n` rows of `normed` into `delta` (`[n, hidden]`),
/// writing their cache rows into one layer's latent `cache`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_latent(
    s: &LayerStep,
    layer: &GpuLatent,
    b: &mut LatentBuffers,
    normed: &CudaView<bf16>,
    n: usize,
    cache: &mut CudaSlice<bf16>,
    layout: &KvLayout,
    delta: &mut CudaViewMut<bf16>,
) -> Result<(), GpuForwardError> {
    let (c, k, stream, gemm) = (s.config, s.kernels, s.stream, s.gemm);
    let m = mla(c);
    let heads = c.num_heads;
    let (l, r, p, v) = (
        m.kv_lora_rank,
        m.qk_rope_head_dim,
        m.qk_nope_head_dim,
        m.v_head_dim,
    );
    let (qk, width) = (m.qk_head_dim(), l + r);
    let q_first = q_first(c);
    let stride = q_first + width;
    let eps = c.rms_norm_eps as f32;
    let LatentBuffers {
        qkv_a,
        q_a,
        q,
        q_lat,
        o_lat,
        attn,
    } = b;
    let qkv_a_out = &mut qkv_a.slice_mut(0..n * stride);
    gemm.linear(
        k,
        stream,
        normed,
        &layer.qkv_a.as_view(),
        qkv_a_out,
        n,
        stride,
    )?;
    // The query: read from the first projection, or through q_a_layernorm and q_b_proj.
    let (q_all, q_stride) = match (&layer.q_b, m.q_lora_rank) {
        (Some((norm, q_b)), Some(rank)) => {
            let q_a = &mut q_a.slice_mut(0..n * rank);
            let src = qkv_a.slice(0..n * stride);
            rms_norm_rows(k, stream, &src, stride, &norm.as_view(), q_a, n, eps)?;
            let q_out = &mut q.slice_mut(0..n * heads * qk);
            gemm.linear(
                k,
                stream,
                &q_a.as_view(),
                &q_b.as_view(),
                q_out,
                n,
                heads * qk,
            )?;
            (q.slice(0..n * heads * qk), heads * qk)
        }
        _ => (qkv_a.slice(0..n * stride), stride),
    };
    let kv_b = layer.kv_b.as_view();
    let q_lat = &mut q_lat.slice_mut(0..n * heads * width);
    // Each head's absorbed query: q_nope (its first p columns) times W_UK, the head's first
    // p rows of kv_b ([p, latent]).
    gemm.batched(
        stream,
        Strided {
            view: &q_all,
            ld: q_stride,
            batch_stride: qk,
        },
        Strided {
            view: &kv_b,
            ld: l,
            batch_stride: (p + v) * l,
        },
        WeightLayout::InByOut,
        q_lat,
        heads * width,
        width,
        BatchedShape {
            batches: heads,
            m: n,
            n: l,
            k: p,
        },
    )?;
    let op = GpuMlaAttention {
        num_heads: heads,
        latent: l,
        scale: m.softmax_scale as f32,
    };
    let kv_a = qkv_a.slice(q_first..n * stride);
    let projections = MlaProjections {
        q: &q_all,
        q_stride,
        nope: p,
        kv_a: &kv_a,
        kv_stride: stride,
        kv_norm: &layer.kv_norm.as_view(),
        eps,
    };
    op.prepare(
        k,
        stream,
        projections,
        s.rotary,
        cache,
        layout,
        s.plan,
        q_lat,
    )?;
    let o_lat = &mut o_lat.slice_mut(0..n * heads * l);
    op.forward(k, stream, &q_lat.as_view(), cache, layout, s.plan, o_lat)?;
    // Each head's values: its latent output times W_UV, the head's last v rows of kv_b
    // ([v, latent]).
    let attn = &mut attn.slice_mut(0..n * heads * v);
    let uv = kv_b.slice(p * l..);
    gemm.batched(
        stream,
        Strided {
            view: &o_lat.as_view(),
            ld: heads * l,
            batch_stride: l,
        },
        Strided {
            view: &uv,
            ld: l,
            batch_stride: (p + v) * l,
        },
        WeightLayout::OutByIn,
        attn,
        heads * v,
        v,
        BatchedShape {
            batches: heads,
            m: n,
            n: v,
            k: l,
        },
    )?;
    let h = c.hidden_size;
    gemm.linear(
        k,
        stream,
        &attn.as_view(),
        &layer.o_proj.as_view(),
        delta,
        n,
        h,
    )?;
    Ok(())
}
