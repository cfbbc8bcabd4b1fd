//! A checkpoint's tensors on the GPU in bf16, q/k/v and gate/up fused as on the CPU.

use crate::config::ModelConfig;
use crate::progress;
use crate::weights::{WeightError, Weights};
use cudarc::driver::CudaSlice;
use half::bf16;
use peregrine_kernels::cuda::elementwise::fill_uniform;
use peregrine_kernels::cuda::CudaKernels;
use peregrine_runtime::cuda::{Gpu, GpuError};

/// One decoder layer's parameters.
pub struct GpuLayer {
    pub input_norm: CudaSlice<bf16>,
    /// `[q + k + v, hidden]`.
    pub qkv: CudaSlice<bf16>,
    pub qkv_bias: Option<CudaSlice<bf16>>,
    pub q_norm: Option<CudaSlice<bf16>>,
    pub k_norm: Option<CudaSlice<bf16>>,
    pub o_proj: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    pub gate_up: CudaSlice<bf16>,
    pub down: CudaSlice<bf16>,
}

/// Every parameter of the model on the device.
pub struct GpuWeights {
    pub embed: CudaSlice<bf16>,
    pub layers: Vec<GpuLayer>,
    pub norm: CudaSlice<bf16>,
    /// `None` when tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
}

/// Why the weights could not be put on the device.
#[derive(Debug, thiserror::Error)]
pub enum GpuWeightError {
    #[error(transparent)]
    Weight(#[from] WeightError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("CUDA: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

fn to_device(gpu: &Gpu, values: &[f32]) -> Result<CudaSlice<bf16>, GpuError> {
    let host: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
    gpu.upload(&host)
}

impl GpuWeights {
    /// Reads, fuses, converts to bf16 and uploads every tensor, checking every shape; a bar
    /// on stderr counts the layers uploaded.
    pub fn load(gpu: &Gpu, c: &ModelConfig, w: &Weights) -> Result<GpuWeights, GpuWeightError> {
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd, inter) = (c.num_heads * d, c.num_kv_heads * d, c.intermediate_size);
        let bar = progress::bar(c.num_layers as u64, "uploading weights", "layers");
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}");
            let get = |name: &str, shape: &[usize]| w.f32(&format!("{p}.{name}"), shape);
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
                    ("self_attn.q_proj.weight", qd),
                    ("self_attn.k_proj.weight", kvd),
                    ("self_attn.v_proj.weight", kvd),
                ],
                Some(h),
            )?;
            let qkv_bias = if c.qkv_bias {
                let bias = fused(
                    &[
                        ("self_attn.q_proj.bias", qd),
                        ("self_attn.k_proj.bias", kvd),
                        ("self_attn.v_proj.bias", kvd),
                    ],
                    None,
                )?;
                Some(to_device(gpu, &bias)?)
            } else {
                None
            };
            let norm = |name: &str| to_device(gpu, &get(name, &[d])?).map_err(GpuWeightError::from);
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(norm("self_attn.q_norm.weight")?),
                    Some(norm("self_attn.k_norm.weight")?),
                )
            } else {
                (None, None)
            };
            let gate_up = fused(
                &[
                    ("mlp.gate_proj.weight", inter),
                    ("mlp.up_proj.weight", inter),
                ],
                Some(h),
            )?;
            layers.push(GpuLayer {
                input_norm: to_device(gpu, &get("input_layernorm.weight", &[h])?)?,
                qkv: to_device(gpu, &qkv)?,
                qkv_bias,
                q_norm,
                k_norm,
                o_proj: to_device(gpu, &get("self_attn.o_proj.weight", &[h, qd])?)?,
                post_norm: to_device(gpu, &get("post_attention_layernorm.weight", &[h])?)?,
                gate_up: to_device(gpu, &gate_up)?,
                down: to_device(gpu, &get("mlp.down_proj.weight", &[h, inter])?)?,
            });
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
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd, inter) = (c.num_heads * d, c.num_kv_heads * d, c.intermediate_size);
        let mut next_seed = seed;
        let mut matrix = |rows: usize, cols: usize, scale: f32| {
            let mut m = gpu.zeros::<bf16>(rows * cols)?;
            next_seed = next_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            fill_uniform(
                kernels,
                gpu.stream(),
                &mut m.as_view_mut(),
                next_seed,
                scale,
            )?;
            Ok::<_, GpuWeightError>(m)
        };
        let fan_in = |k: usize| 1.0 / (k as f32).sqrt();
        let ones = |n: usize| gpu.upload(&vec![bf16::ONE; n]);
        let mut layers = Vec::with_capacity(c.num_layers);
        for _ in 0..c.num_layers {
            layers.push(GpuLayer {
                input_norm: ones(h)?,
                qkv: matrix(qd + 2 * kvd, h, fan_in(h))?,
                qkv_bias: if c.qkv_bias {
                    Some(matrix(1, qd + 2 * kvd, 0.1)?)
                } else {
                    None
                },
                q_norm: if c.qk_norm { Some(ones(d)?) } else { None },
                k_norm: if c.qk_norm { Some(ones(d)?) } else { None },
                o_proj: matrix(h, qd, fan_in(qd))?,
                post_norm: ones(h)?,
                gate_up: matrix(2 * inter, h, fan_in(h))?,
                down: matrix(h, inter, fan_in(inter))?,
            });
        }
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(matrix(c.vocab_size, h, fan_in(h))?)
        };
        let weights = GpuWeights {
            embed: matrix(c.vocab_size, h, 1.0)?,
            layers,
            norm: ones(h)?,
            lm_head,
        };
        weights.settle(gpu)
    }

    /// Bytes of parameters held.
    pub fn bytes(&self) -> u64 {
        let len = |s: &CudaSlice<bf16>| s.len() as u64;
        let opt = |s: &Option<CudaSlice<bf16>>| s.as_ref().map_or(0, len);
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                len(&l.input_norm)
                    + len(&l.qkv)
                    + opt(&l.qkv_bias)
                    + opt(&l.q_norm)
                    + opt(&l.k_norm)
                    + len(&l.o_proj)
                    + len(&l.post_norm)
                    + len(&l.gate_up)
                    + len(&l.down)
            })
            .sum();
        2 * (layers + len(&self.embed) + len(&self.norm) + opt(&self.lm_head))
    }
}
