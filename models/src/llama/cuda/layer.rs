//! One decoder layer's attention and MLP on the GPU, as the target's forward runs each of
//! its layers and a multi-token prediction head runs its one: the caller norms the layer's
//! input (or folds the norm into the first product) and adds its output.

use super::experts::{mix, ExpertBuffers};
use super::forward::{attend, LayerKv};
use super::latent::attend_latent;
use super::step::{LayerInput, LayerStep};
use super::weights::{GpuAttention, GpuLayer, GpuMlp};
use super::{GpuForwardError, StepBuffers};
use peregrine_kernels::cuda::elementwise::add_bias;
use peregrine_kernels::cuda::gemm::NormedInput;
use peregrine_kernels::cuda::norm::{add_rms_norm, head_rms_norm};
use peregrine_ops::cuda::GpuKvCache;

impl LayerStep<'_, '_> {
    /// Queues `layer`'s attention (its cache rows written into layer `cache_layer` of
    /// `cache`) and MLP over the `n` rows of `b`.
    pub(crate) fn run(
        &self,
        layer: &GpuLayer,
        b: &mut StepBuffers,
        n: usize,
        input: LayerInput,
        cache: &mut GpuKvCache,
        cache_layer: usize,
    ) -> Result<(), GpuForwardError> {
        let (k, stream, gemm, c) = (self.kernels, self.stream, self.gemm, self.config);
        let (h, d, inter, eps) = (
            c.hidden_size,
            c.head_dim,
            c.intermediate_size,
            c.rms_norm_eps as f32,
        );
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let width = qd + 2 * kvd;
        let g = match &layer.attention {
            GpuAttention::Grouped(g) => g,
            GpuAttention::Latent(m) => {
                let buffers = b.latent.as_deref_mut().expect("latent buffers");
                let layout = *cache.layout();
                let (latent_cache, _) = cache.layer_mut(cache_layer);
                let x = &b.normed.as_view();
                attend_latent(self, m, buffers, x, n, latent_cache, &layout, &mut b.delta)?;
                return self.mlp(layer, b, n);
            }
        };
        let (qkv, attn) = (&mut b.qkv, &mut b.attn);
        let qkv_w = g.qkv.as_view();
        let norm = layer.input_norm.as_view();
        match input {
            LayerInput::Fused => {
                let x = NormedInput {
                    residual: &b.residual.as_view(),
                    weight: &norm,
                    eps,
                };
                gemm.normed_linear(k, stream, x, &qkv_w, qkv, n, width)?;
            }
            LayerInput::Normed => {
                gemm.linear(k, stream, &b.normed.as_view(), &qkv_w, qkv, n, width)?;
            }
        }
        if let Some(bias) = &g.qkv_bias {
            add_bias(k, stream, qkv, &bias.as_view(), n)?;
        }
        if let (Some(qn), Some(kn)) = (&g.q_norm, &g.k_norm) {
            let (q_heads, kv_heads) = (c.num_heads, c.num_kv_heads);
            head_rms_norm(k, stream, qkv, &qn.as_view(), n, width, 0, q_heads, eps)?;
            head_rms_norm(k, stream, qkv, &kn.as_view(), n, width, qd, kv_heads, eps)?;
        }
        let kv = LayerKv::of(cache, cache_layer);
        let (attention, rotary, dplan) = (self.attention, self.rotary, self.plan);
        attend(k, stream, attention, qkv, width, rotary, kv, dplan, attn)?;
        let o_w = g.o_proj.as_view();
        match (&layer.mlp, input) {
            (GpuMlp::Dense { gate_up: gu, down }, LayerInput::Fused) => {
                let residual = &mut b.residual;
                let post = layer.post_norm.as_view();
                let (gu, down) = (gu.as_view(), down.as_view());
                gemm.add_linear(k, stream, &attn.as_view(), &o_w, residual, n, h)?;
                let x = NormedInput {
                    residual: &residual.as_view(),
                    weight: &post,
                    eps,
                };
                let act = &mut b.act;
                gemm.normed_gate_up_act(k, stream, x, &gu, act, n, inter)?;
                gemm.add_linear(k, stream, &act.as_view(), &down, residual, n, h)?;
                Ok(())
            }
            _ => {
                gemm.linear(k, stream, &attn.as_view(), &o_w, &mut b.delta, n, h)?;
                self.mlp(layer, b, n)
            }
        }
    }

    /// Queues `layer`'s MLP unfused: `residual += delta` and its post-attention norm into
    /// `normed`, then the dense MLP or the mixture of those rows into `delta`.
    fn mlp(&self, layer: &GpuLayer, b: &mut StepBuffers, n: usize) -> Result<(), GpuForwardError> {
        let (k, stream, gemm, c) = (self.kernels, self.stream, self.gemm, self.config);
        let (h, inter, eps) = (c.hidden_size, c.intermediate_size, c.rms_norm_eps as f32);
        let StepBuffers {
            residual,
            normed,
            delta,
            gate_up,
            act,
            experts,
            ..
        } = b;
        let post = layer.post_norm.as_view();
        add_rms_norm(k, stream, residual, &delta.as_view(), &post, normed, n, eps)?;
        match &layer.mlp {
            GpuMlp::Dense { gate_up: gu, down } => {
                let (gu, down) = (gu.as_view(), down.as_view());
                gemm.gate_up_act(k, stream, &normed.as_view(), &gu, gate_up, act, n, inter)?;
                gemm.linear(k, stream, &act.as_view(), &down, delta, n, h)?;
            }
            GpuMlp::Experts(e) => {
                let buffers: &mut ExpertBuffers = experts.as_deref_mut().expect("mixture buffers");
                mix(k, stream, gemm, c, e, buffers, &normed.as_view(), n, delta)?;
            }
        }
        Ok(())
    }
}
