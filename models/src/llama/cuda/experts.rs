//! The mixture-of-experts MLP (DeepSeek-V2/V3, Qwen3-MoE) in the GPU forward, as on the
//! CPU (`llama/moe.rs`) and with no host round trip, so that it captures into graphs: the
//! router's logits (in f32, `moe_router_logits`), each row's route on the device (`moe_route`), the rows
//! sorted by expert (`moe_sort`), each expert's gated MLP over its rows and its down
//! projection (`moe_gate_up_act`, `moe_down`, which skip the experts no row chose), the
//! routed sum in the order of the experts' indices plus the shared experts' output
//! (`moe_combine`). A row's result depends on its own input alone.

use super::upload::{to_device, GpuWeightError, RandomWeights};
use super::GpuForwardError;
use crate::config::{GroupScore, ModelConfig, MoeConfig, Scoring};
use crate::weights::Weights;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use peregrine_kernels::cuda::gemm::Gemm;
use peregrine_kernels::cuda::moe::{
    moe_combine, moe_down, moe_gate_up_act, moe_route, moe_router_logits, moe_sort, MoeRouting,
};
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// One layer's mixture on the device.
pub struct GpuExperts {
    /// The router, `[experts, hidden]`, kept in f32: a route chosen from bf16 logits
    /// flips where two experts' scores nearly tie.
    pub router: CudaSlice<f32>,
    /// `e_score_correction_bias`, `[experts]` f32, where the router has one.
    pub bias: Option<CudaSlice<f32>>,
    /// Every routed expert's gate rows then up rows, `[experts, 2 * inter, hidden]`.
    pub gate_up: CudaSlice<bf16>,
    /// Every routed expert's down projection, `[experts, hidden, inter]`.
    pub down: CudaSlice<bf16>,
    /// The shared experts' `[2 * shared_inter, hidden]` gate/up and `[hidden,
    /// shared_inter]` down.
    pub shared: Option<(CudaSlice<bf16>, CudaSlice<bf16>)>,
}

/// The config's mixture, which a mixture layer's model has.
pub(super) fn moe(c: &ModelConfig) -> &MoeConfig {
    c.moe
        .as_ref()
        .expect("a mixture layer of a model without one")
}

/// The routing of `m` as the kernels take it.
pub(super) fn routing(m: &MoeConfig) -> MoeRouting {
    MoeRouting {
        num_experts: m.num_experts,
        experts_per_token: m.experts_per_token,
        sigmoid: m.scoring == Scoring::Sigmoid,
        groups: m.groups,
        top_groups: m.top_groups,
        group_top_two: m.group_score == GroupScore::TopTwoSum,
        normalize: m.normalize,
        routed_scaling: m.routed_scaling as f32,
    }
}

impl GpuExperts {
    /// Layer `prefix`'s mixture (`{prefix}.mlp.gate`, `.experts.{e}`, `.shared_experts`).
    pub fn load(
        gpu: &Gpu,
        c: &ModelConfig,
        w: &Weights,
        prefix: &str,
    ) -> Result<GpuExperts, GpuWeightError> {
        let m = moe(c);
        let (h, e, inter) = (c.hidden_size, m.num_experts, m.expert_intermediate_size);
        let get = |n: &str, shape: &[usize]| w.f32(&format!("{prefix}.mlp.{n}"), shape);
        let bias = if m.score_bias {
            let b = get("gate.e_score_correction_bias", &[e])?;
            Some(gpu.upload(&b)?)
        } else {
            None
        };
        let gated = |p: &str, inter: usize| {
            let mut gate_up = get(&format!("{p}.gate_proj.weight"), &[inter, h])?;
            gate_up.extend(get(&format!("{p}.up_proj.weight"), &[inter, h])?);
            let down = get(&format!("{p}.down_proj.weight"), &[h, inter])?;
            Ok::<_, GpuWeightError>((gate_up, down))
        };
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for i in 0..e {
            let (gu, d) = gated(&format!("experts.{i}"), inter)?;
            gate_up.extend(gu);
            down.extend(d);
        }
        let shared = if m.shared_intermediate_size > 0 {
            let (gu, d) = gated("shared_experts", m.shared_intermediate_size)?;
            Some((to_device(gpu, &gu)?, to_device(gpu, &d)?))
        } else {
            None
        };
        Ok(GpuExperts {
            router: gpu.upload(&get("gate.weight", &[e, h])?)?,
            bias,
            gate_up: to_device(gpu, &gate_up)?,
            down: to_device(gpu, &down)?,
            shared,
        })
    }

    /// Random weights of `c`'s shapes (see [`RandomWeights`]); no score bias is random:
    /// a model that has one gets zeros.
    pub fn random(r: &mut RandomWeights, c: &ModelConfig) -> Result<GpuExperts, GpuWeightError> {
        let m = moe(c);
        let (h, e, inter) = (c.hidden_size, m.num_experts, m.expert_intermediate_size);
        let si = m.shared_intermediate_size;
        let shared = if si > 0 {
            Some((r.linear(2 * si, h)?, r.linear(h, si)?))
        } else {
            None
        };
        let bias = if m.score_bias {
            Some(r.gpu().zeros::<f32>(e)?)
        } else {
            None
        };
        Ok(GpuExperts {
            router: r.f32_linear(e, h)?,
            bias,
            gate_up: r.matrix(e * 2 * inter, h, 1.0 / (h as f32).sqrt())?,
            down: r.matrix(e * h, inter, 1.0 / (inter as f32).sqrt())?,
            shared,
        })
    }

    /// bf16 elements held (each f32 of the router and the bias counted as two).
    pub fn elements(&self) -> u64 {
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |(gu, d)| (gu.len() + d.len()) as u64);
        let bias = self.bias.as_ref().map_or(0, |b| 2 * b.len() as u64);
        let router = 2 * self.router.len() as u64;
        (self.gate_up.len() + self.down.len()) as u64 + router + shared + bias
    }
}

/// The activations of a mixture layer for up to `max_tokens` rows.
pub struct ExpertBuffers {
    /// `[tokens, experts]` router logits.
    pub logits: CudaSlice<f32>,
    /// `[tokens, k]` each row's experts and their weights.
    pub experts: CudaSlice<i32>,
    pub weights: CudaSlice<f32>,
    /// `[experts + 1]` where each expert's sorted pairs start.
    pub offsets: CudaSlice<i32>,
    /// `[tokens * k]` the row of each sorted pair, and the sorted position of each (row,
    /// slot).
    pub pair_rows: CudaSlice<i32>,
    pub slot_pos: CudaSlice<i32>,
    /// `[tokens * k, inter]` each pair's gated activation.
    pub act: CudaSlice<bf16>,
    /// `[tokens * k, hidden]` each pair's expert output, f32.
    pub out: CudaSlice<f32>,
    /// `[tokens, hidden]` the shared experts' output; `[tokens, 2 * shared_inter]` and
    /// `[tokens, shared_inter]` their inner activations.
    pub shared: CudaSlice<bf16>,
    pub shared_gate_up: CudaSlice<bf16>,
    pub shared_act: CudaSlice<bf16>,
}

/// Elements per token of each [`ExpertBuffers`] buffer (offsets apart), in field order.
fn widths(c: &ModelConfig) -> [usize; 10] {
    let m = moe(c);
    let (k, h) = (m.experts_per_token, c.hidden_size);
    let si = m.shared_intermediate_size;
    [
        m.num_experts,
        k,
        k,
        0,
        k,
        k,
        k * m.expert_intermediate_size,
        k * h,
        if si > 0 { h } else { 0 },
        // The shared inner activations, both.
        3 * si,
    ]
}

impl ExpertBuffers {
    /// Buffers for `max_tokens` rows of model `c` (which has a mixture).
    pub fn new(gpu: &Gpu, c: &ModelConfig, max_tokens: usize) -> Result<ExpertBuffers, GpuError> {
        let m = moe(c);
        let t = max_tokens;
        let w = widths(c);
        let si = m.shared_intermediate_size;
        // Empty buffers still take one element: a zero-sized allocation is refused.
        let b16 = |len: usize| gpu.zeros::<bf16>(len.max(1));
        Ok(ExpertBuffers {
            logits: gpu.zeros(t * w[0])?,
            experts: gpu.zeros(t * w[1])?,
            weights: gpu.zeros(t * w[2])?,
            offsets: gpu.zeros(m.num_experts + 1)?,
            pair_rows: gpu.zeros(t * w[4])?,
            slot_pos: gpu.zeros(t * w[5])?,
            act: b16(t * w[6])?,
            out: gpu.zeros(t * w[7])?,
            shared: b16(t * w[8])?,
            shared_gate_up: b16(t * 2 * si)?,
            shared_act: b16(t * si)?,
        })
    }

    /// Device bytes [`ExpertBuffers::new`] allocates for `max_tokens` rows of `c`.
    pub fn bytes_for(c: &ModelConfig, max_tokens: usize) -> u64 {
        let w = widths(c);
        let four = (w[0] + w[1] + w[2] + w[4] + w[5] + w[7]) as u64;
        let two = (w[6] + w[8] + w[9]) as u64;
        let offsets = 4 * (moe(c).num_experts as u64 + 1);
        (4 * four + 2 * two).saturating_mul(max_tokens as u64) + offsets
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        let four = [
            &self.experts,
            &self.offsets,
            &self.pair_rows,
            &self.slot_pos,
        ]
        .iter()
        .map(|s| s.len())
        .sum::<usize>()
            + self.logits.len()
            + self.weights.len()
            + self.out.len();
        let two = self.act.len() + self.shared.len() + self.shared_gate_up.len();
        4 * four as u64 + 2 * (two + self.shared_act.len()) as u64
    }
}

/// Queues the mixture of the `n` rows of `normed` into `delta` (`[n, hidden]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn mix(
    k: &CudaKernels,
    stream: &CudaStream,
    gemm: &Gemm,
    c: &ModelConfig,
    layer: &GpuExperts,
    b: &mut ExpertBuffers,
    normed: &CudaView<bf16>,
    n: usize,
    delta: &mut CudaViewMut<bf16>,
) -> Result<(), GpuForwardError> {
    let m = moe(c);
    let route = routing(m);
    let (h, e, kk) = (c.hidden_size, m.num_experts, m.experts_per_token);
    let inter = m.expert_intermediate_size;
    let logits = &mut b.logits.slice_mut(0..n * e);
    let router = layer.router.as_view();
    moe_router_logits(k, stream, normed, &router, n, h, e, logits)?;
    let bias = layer.bias.as_ref().map(|b| b.as_view());
    let experts = &mut b.experts.slice_mut(0..n * kk);
    let weights = &mut b.weights.slice_mut(0..n * kk);
    moe_route(
        k,
        stream,
        &logits.as_view(),
        bias.as_ref(),
        &route,
        n,
        experts,
        weights,
    )?;
    let offsets = &mut b.offsets.slice_mut(0..e + 1);
    let pair_rows = &mut b.pair_rows.slice_mut(0..n * kk);
    let slot_pos = &mut b.slot_pos.slice_mut(0..n * kk);
    moe_sort(
        k,
        stream,
        &experts.as_view(),
        n,
        &route,
        offsets,
        pair_rows,
        slot_pos,
    )?;
    let act = &mut b.act.slice_mut(0..n * kk * inter);
    let (offsets, pair_rows) = (offsets.as_view(), pair_rows.as_view());
    let gate_up = layer.gate_up.as_view();
    moe_gate_up_act(
        k, stream, normed, &gate_up, &offsets, &pair_rows, &route, h, inter, n, act,
    )?;
    let out = &mut b.out.slice_mut(0..n * kk * h);
    let down = layer.down.as_view();
    moe_down(
        k,
        stream,
        &act.as_view(),
        &down,
        &offsets,
        &route,
        h,
        inter,
        n,
        out,
    )?;
    let shared = match &layer.shared {
        Some((gu, d)) => {
            let si = m.shared_intermediate_size;
            let gate_up = &mut b.shared_gate_up.slice_mut(0..n * 2 * si);
            let act = &mut b.shared_act.slice_mut(0..n * si);
            let (gu, d) = (gu.as_view(), d.as_view());
            gemm.gate_up_act(k, stream, normed, &gu, gate_up, act, n, si)?;
            let shared = &mut b.shared.slice_mut(0..n * h);
            gemm.linear(k, stream, &act.as_view(), &d, shared, n, h)?;
            Some(b.shared.slice(0..n * h))
        }
        None => None,
    };
    moe_combine(
        k,
        stream,
        &out.as_view(),
        &experts.as_view(),
        &weights.as_view(),
        &slot_pos.as_view(),
        shared.as_ref(),
        &route,
        h,
        n,
        delta,
    )?;
    Ok(())
}
