//! A checkpoint's tensors on the GPU in bf16, q/k/v and gate/up fused as on the CPU.

use super::experts::GpuExperts;
use super::latent::GpuLatent;
use super::upload::{to_device, GpuWeightError, RandomWeights};
use crate::config::ModelConfig;
use crate::progress;
use crate::weights::{WeightError, Weights};
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::Gpu;

/// One decoder layer's parameters.
pub struct GpuLayer {
    pub input_norm: CudaSlice<bf16>,
    pub attention: GpuAttention,
    pub post_norm: CudaSlice<bf16>,
    pub mlp: GpuMlp,
}

/// A layer's attention: grouped-query, or latent (DeepSeek's MLA).
pub enum GpuAttention {
    Grouped(GpuGrouped),
    Latent(GpuLatent),
}

/// Grouped-query attention's parameters.
pub struct GpuGrouped {
    /// `[q + k + v, hidden]`.
    pub qkv: CudaSlice<bf16>,
    pub qkv_bias: Option<CudaSlice<bf16>>,
    pub q_norm: Option<CudaSlice<bf16>>,
    pub k_norm: Option<CudaSlice<bf16>>,
    pub o_proj: CudaSlice<bf16>,
}

/// A layer's MLP: dense, or a mixture of experts.
pub enum GpuMlp {
    Dense {
        /// `[2 * intermediate, hidden]`: gate rows, then up rows.
        gate_up: CudaSlice<bf16>,
        down: CudaSlice<bf16>,
    },
    /// Boxed: a mixture's handles outweigh the dense pair's.
    Experts(Box<GpuExperts>),
}

/// Every parameter of the model on the device.
pub struct GpuWeights {
    pub embed: CudaSlice<bf16>,
    pub layers: Vec<GpuLayer>,
    pub norm: CudaSlice<bf16>,
    /// `None` when tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
}

impl GpuWeights {
    /// Reads, fuses, converts to bf16 and uploads every tensor, checking every shape; a bar
    /// on stderr counts the layers uploaded.
    pub fn load(gpu: &Gpu, c: &ModelConfig, w: &Weights) -> Result<GpuWeights, GpuWeightError> {
        let h = c.hidden_size;
        let bar = progress::bar(c.num_layers as u64, "uploading weights", "layers");
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            layers.push(GpuLayer::load(gpu, c, w, l)?);
            bar.inc(1);
        }
        let lm_head = if c.tie_word_embeddings && !w.contains("lm_head.weight") {
            None
        } else {
            Some(to_device(
                gpu,
                &w.f32("lm_head.weight", &[c.vocab_size, h])?,
            )?)
        };
        let weights = GpuWeights {
            embed: to_device(
                gpu,
                &w.f32("model.embed_tokens.weight", &[c.vocab_size, h])?,
            )?,
            layers,
            norm: to_device(gpu, &w.f32("model.norm.weight", &[h])?)?,
            lm_head,
        };
        let weights = weights.settle(gpu)?;
        progress::finish(
            &bar,
            &format!("uploaded the weights of {} layers", c.num_layers),
        );
        Ok(weights)
    }

    /// Waits until every weight is on the device. Kernels load weights before they wait for
    /// the kernel ahead of them (programmatic dependent launch, `kernels/src/cuda/launch.rs`),
    /// so no kernel may be queued while a weight is still being written.
    fn settle(self, gpu: &Gpu) -> Result<GpuWeights, GpuWeightError> {
        gpu.stream().synchronize()?;
        Ok(self)
    }

    /// Random weights of `c`'s shapes, made on the device: matrices uniform in
    /// `±1/sqrt(fan_in)`, the embedding in ±1, norm weights 1.
    pub fn random(
        gpu: &Gpu,
        kernels: &CudaKernels,
        c: &ModelConfig,
        seed: u64,
    ) -> Result<GpuWeights, GpuWeightError> {
        let h = c.hidden_size;
        let mut r = RandomWeights::new(gpu, kernels, seed);
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            layers.push(GpuLayer::random(&mut r, c, l)?);
        }
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(r.linear(c.vocab_size, h)?)
        };
        let weights = GpuWeights {
            embed: r.matrix(c.vocab_size, h, 1.0)?,
            layers,
            norm: r.ones(h)?,
            lm_head,
        };
        weights.settle(gpu)
    }

    /// Bytes of parameters held.
    pub fn bytes(&self) -> u64 {
        let len = |s: &CudaSlice<bf16>| s.len() as u64;
        let opt = |s: &Option<CudaSlice<bf16>>| s.as_ref().map_or(0, len);
        let layers: u64 = self.layers.iter().map(GpuLayer::bytes).sum();
        layers + 2 * (len(&self.embed) + len(&self.norm) + opt(&self.lm_head))
    }
}

impl GpuLayer {
    /// Decoder layer `l` of checkpoint `w` (`model.layers.{l}.*`; past `c.num_layers`, a
    /// multi-token prediction layer's block), every shape checked.
    pub fn load(
        gpu: &Gpu,
        c: &ModelConfig,
        w: &Weights,
        l: usize,
    ) -> Result<GpuLayer, GpuWeightError> {
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let p = format!("model.layers.{l}");
        let get = |name: &str, shape: &[usize]| w.f32(&format!("{p}.{name}"), shape);
        let attention = match c.mla {
            Some(_) => GpuAttention::Latent(GpuLatent::load(gpu, c, w, &p)?),
            None => GpuAttention::Grouped(GpuGrouped::load(gpu, c, w, &p)?),
        };
        let mlp = if mixes(c, l) {
            GpuMlp::Experts(Box::new(GpuExperts::load(gpu, c, w, &p)?))
        } else {
            let mut gate_up = get("mlp.gate_proj.weight", &[inter, h])?;
            gate_up.extend(get("mlp.up_proj.weight", &[inter, h])?);
            GpuMlp::Dense {
                gate_up: to_device(gpu, &gate_up)?,
                down: to_device(gpu, &get("mlp.down_proj.weight", &[h, inter])?)?,
            }
        };
        Ok(GpuLayer {
            input_norm: to_device(gpu, &get("input_layernorm.weight", &[h])?)?,
            attention,
            post_norm: to_device(gpu, &get("post_attention_layernorm.weight", &[h])?)?,
            mlp,
        })
    }

    /// Layer `l` of `c`'s shapes with weights from `r`: norm weights 1.
    pub fn random(
        r: &mut RandomWeights,
        c: &ModelConfig,
        l: usize,
    ) -> Result<GpuLayer, GpuWeightError> {
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let attention = match c.mla {
            Some(_) => GpuAttention::Latent(GpuLatent::random(r, c)?),
            None => GpuAttention::Grouped(GpuGrouped::random(r, c)?),
        };
        let mlp = if mixes(c, l) {
            GpuMlp::Experts(Box::new(GpuExperts::random(r, c)?))
        } else {
            GpuMlp::Dense {
                gate_up: r.linear(2 * inter, h)?,
                down: r.linear(h, inter)?,
            }
        };
        Ok(GpuLayer {
            input_norm: r.ones(h)?,
            attention,
            post_norm: r.ones(h)?,
            mlp,
        })
    }

    /// Bytes of the layer's parameters.
    pub fn bytes(&self) -> u64 {
        let len = |s: &CudaSlice<bf16>| s.len() as u64;
        let opt = |s: &Option<CudaSlice<bf16>>| s.as_ref().map_or(0, len);
        let attention = match &self.attention {
            GpuAttention::Grouped(g) => {
                len(&g.qkv) + opt(&g.qkv_bias) + opt(&g.q_norm) + opt(&g.k_norm) + len(&g.o_proj)
            }
            GpuAttention::Latent(m) => m.elements(),
        };
        let mlp = match &self.mlp {
            GpuMlp::Dense { gate_up, down } => len(gate_up) + len(down),
            GpuMlp::Experts(e) => e.elements(),
        };
        2 * (len(&self.input_norm) + attention + len(&self.post_norm) + mlp)
    }
}

/// Whether layer `l` of `c` is a mixture of experts.
fn mixes(c: &ModelConfig, l: usize) -> bool {
    c.moe
        .as_ref()
        .is_some_and(|m| m.layers.get(l).copied().unwrap_or(false))
}

impl GpuGrouped {
    /// Layer `p`'s grouped-query attention (`{p}.self_attn.*`), q/k/v fused.
    fn load(gpu: &Gpu, c: &ModelConfig, w: &Weights, p: &str) -> Result<Self, GpuWeightError> {
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let get = |name: &str, shape: &[usize]| w.f32(&format!("{p}.self_attn.{name}"), shape);
        let fused = |parts: &[(&str, usize)], cols: Option<usize>| {
            let mut all = Vec::new();
            for &(name, rows) in parts {
                let shape = match cols {
                    Some(cols) => vec![rows, cols],
                    None => vec![rows],
                };
                all.extend(get(name, &shape)?);
            }
            Ok::<_, WeightError>(all)
        };
        let qkv = fused(
            &[
                ("q_proj.weight", qd),
                ("k_proj.weight", kvd),
                ("v_proj.weight", kvd),
            ],
            Some(h),
        )?;
        let qkv_bias = if c.qkv_bias {
            let bias = fused(
                &[
                    ("q_proj.bias", qd),
                    ("k_proj.bias", kvd),
                    ("v_proj.bias", kvd),
                ],
                None,
            )?;
            Some(to_device(gpu, &bias)?)
        } else {
            None
        };
        let norm = |name: &str| to_device(gpu, &get(name, &[d])?).map_err(GpuWeightError::from);
        let (q_norm, k_norm) = if c.qk_norm {
            (Some(norm("q_norm.weight")?), Some(norm("k_norm.weight")?))
        } else {
            (None, None)
        };
        Ok(GpuGrouped {
            qkv: to_device(gpu, &qkv)?,
            qkv_bias,
            q_norm,
            k_norm,
            o_proj: to_device(gpu, &get("o_proj.weight", &[h, qd])?)?,
        })
    }

    /// Random weights of `c`'s shapes.
    fn random(r: &mut RandomWeights, c: &ModelConfig) -> Result<Self, GpuWeightError> {
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let qkv_bias = if c.qkv_bias {
            Some(r.matrix(1, qd + 2 * kvd, 0.1)?)
        } else {
            None
        };
        let (q_norm, k_norm) = if c.qk_norm {
            (Some(r.ones(d)?), Some(r.ones(d)?))
        } else {
            (None, None)
        };
        Ok(GpuGrouped {
            qkv: r.linear(qd + 2 * kvd, h)?,
            qkv_bias,
            q_norm,
            k_norm,
            o_proj: r.linear(h, qd)?,
        })
    }
}
