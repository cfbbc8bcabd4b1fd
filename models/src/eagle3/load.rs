//! Loading an EAGLE-3 head from its published safetensors, checked against its target.

use super::{DraftVocab, Eagle3Config, Eagle3Error};
use crate::config::ModelConfig;
use crate::llama::LlamaModel;
use crate::weights::Weights;
use peregrine_kernels::cpu::Matrix;
use peregrine_ops::{Linear, PagedAttention, RmsNorm, Rotary, RotaryLayout};
use peregrine_runtime::cpu::BufferPool;
use std::path::Path;
use std::sync::Arc;

/// A loaded EAGLE-3 head, float32 on the CPU; q/k/v and gate/up are fused. Its weights are
/// shared (`Arc`) with the graphs that record its forward; its buffers come from its own
/// pool.
pub struct Eagle3Head {
    pub(super) config: Eagle3Config,
    /// Target layers whose inputs feed `fc`, in concatenation order.
    pub(super) aux_layers: Vec<usize>,
    pub(super) weights: Arc<HeadWeights>,
    pub(super) vocab: DraftVocab,
    pub(super) attention: PagedAttention,
    pub(super) pool: BufferPool,
}

/// The head's parameters.
pub(super) struct HeadWeights {
    /// `[vocab_size, hidden_size]`: the head's own `embed_tokens`, or the target's.
    pub(super) embed: Arc<Matrix>,
    /// `[H, aux_layers.len() * H_t]`, no bias.
    pub(super) fc: Linear,
    pub(super) input_norm: RmsNorm,
    pub(super) hidden_norm: RmsNorm,
    /// `[nh·hd + 2·nkv·hd, 2H]`.
    pub(super) qkv: Linear,
    pub(super) o_proj: Linear,
    pub(super) post_norm: RmsNorm,
    pub(super) gate_up: Linear,
    pub(super) down: Linear,
    pub(super) norm: Arc<RmsNorm>,
    /// `[V_d, H]`.
    pub(super) lm_head: Arc<Linear>,
    pub(super) rotary: Arc<Rotary>,
}

impl Eagle3Head {
    /// Loads the head in `dir` (config.json and safetensors) for `target`.
    pub fn load(dir: &Path, target: &LlamaModel) -> Result<Eagle3Head, Eagle3Error> {
        let config = Eagle3Config::from_dir(dir)?;
        let weights = Weights::open(dir)?;
        Eagle3Head::from_weights(config, &weights, target.config(), target.embedding_table())
    }

    /// Builds the head from an opened checkpoint for a target of config `target` whose
    /// embedding table is `target_embed` (used when the head has no `embed_tokens`).
    /// Every tensor's shape is checked; layer tensors are read under `midlayer.` (SafeAILab,
    /// SpecForge) or, when the checkpoint has no `midlayer.`, under `layers.0.`.
    pub fn from_weights(
        config: Eagle3Config,
        w: &Weights,
        target: &ModelConfig,
        target_embed: Arc<Matrix>,
    ) -> Result<Eagle3Head, Eagle3Error> {
        let c = &config;
        if c.vocab_size != target.vocab_size {
            return Err(Eagle3Error::Target(format!(
                "its vocab_size is {}, the target's {}",
                c.vocab_size, target.vocab_size
            )));
        }
        if c.target_hidden_size != target.hidden_size {
            return Err(Eagle3Error::Target(format!(
                "its target_hidden_size (or hidden_size) is {}, the target's hidden_size {}",
                c.target_hidden_size, target.hidden_size
            )));
        }
        let aux_layers = c.aux_layers(target.num_layers)?;
        let (h, d, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let eps = c.rms_norm_eps as f32;
        let embed = if w.contains("embed_tokens.weight") {
            Arc::new(w.matrix("embed_tokens.weight", [c.vocab_size, h])?)
        } else if target.hidden_size == h {
            target_embed
        } else {
            return Err(Eagle3Error::Target(format!(
                "the checkpoint has no `embed_tokens.weight` and the head's hidden_size ({h}) \
                 differs from the target's ({}), so the target's table cannot be shared",
                target.hidden_size
            )));
        };
        let fc_in = aux_layers.len() * c.target_hidden_size;
        let fc = Linear::new(w.f32("fc.weight", &[h, fc_in])?.into(), None, h);
        let prefix = if !w.contains("midlayer.hidden_norm.weight")
            && w.contains("layers.0.hidden_norm.weight")
        {
            "layers.0"
        } else {
            "midlayer"
        };
        let get = |name: &str, shape: &[usize]| w.f32(&format!("{prefix}.{name}"), shape);
        let mut qkv = get("self_attn.q_proj.weight", &[qd, 2 * h])?;
        qkv.extend(get("self_attn.k_proj.weight", &[kvd, 2 * h])?);
        qkv.extend(get("self_attn.v_proj.weight", &[kvd, 2 * h])?);
        let mut gate_up = get("mlp.gate_proj.weight", &[inter, h])?;
        gate_up.extend(get("mlp.up_proj.weight", &[inter, h])?);
        let d2t = w.i64("d2t", &[c.draft_vocab_size])?;
        let weights = HeadWeights {
            embed,
            fc,
            input_norm: RmsNorm::new(get("input_layernorm.weight", &[h])?, eps),
            hidden_norm: RmsNorm::new(get("hidden_norm.weight", &[h])?, eps),
            qkv: Linear::new(qkv.into(), None, qd + 2 * kvd),
            o_proj: Linear::new(get("self_attn.o_proj.weight", &[h, qd])?.into(), None, h),
            post_norm: RmsNorm::new(get("post_attention_layernorm.weight", &[h])?, eps),
            gate_up: Linear::new(gate_up.into(), None, 2 * inter),
            down: Linear::new(get("mlp.down_proj.weight", &[h, inter])?.into(), None, h),
            norm: Arc::new(RmsNorm::new(w.f32("norm.weight", &[h])?, eps)),
            lm_head: Arc::new(Linear::new(
                w.f32("lm_head.weight", &[c.draft_vocab_size, h])?.into(),
                None,
                c.draft_vocab_size,
            )),
            rotary: Arc::new(Rotary::new(
                d,
                c.rope_theta,
                &c.rope_scaling,
                RotaryLayout::HalfSplit,
            )),
        };
        Ok(Eagle3Head {
            aux_layers,
            weights: Arc::new(weights),
            vocab: DraftVocab::from_d2t(&d2t, c.vocab_size)?,
            attention: PagedAttention {
                num_heads: c.num_heads,
                scale: 1.0 / (d as f32).sqrt(),
            },
            pool: BufferPool::new(),
            config,
        })
    }

    /// The head with the weights of its products (`fc`, q/k/v, `o_proj`, gate/up, `down`,
    /// `lm_head`) quantized to Q8_0 blocks ([`Linear::to_q8_0`]), read by the same block
    /// kernels as a quantized target's: about a quarter of the float head's bytes a step.
    /// The norms, the rotary tables and the embedding table stay as they are.
    pub fn quantized_q8_0(self) -> Eagle3Head {
        let w = &self.weights;
        let weights = HeadWeights {
            embed: w.embed.clone(),
            fc: w.fc.to_q8_0(),
            input_norm: w.input_norm.clone(),
            hidden_norm: w.hidden_norm.clone(),
            qkv: w.qkv.to_q8_0(),
            o_proj: w.o_proj.to_q8_0(),
            post_norm: w.post_norm.clone(),
            gate_up: w.gate_up.to_q8_0(),
            down: w.down.to_q8_0(),
            norm: w.norm.clone(),
            lm_head: Arc::new(w.lm_head.to_q8_0()),
            rotary: w.rotary.clone(),
        };
        Eagle3Head {
            weights: Arc::new(weights),
            ..self
        }
    }

    /// Bytes of the weights the head's products read each step (`fc`, q/k/v, `o_proj`,
    /// gate/up, `down`, `lm_head`), as they are stored.
    pub fn product_weight_bytes(&self) -> u64 {
        let w = &self.weights;
        [&w.fc, &w.qkv, &w.o_proj, &w.gate_up, &w.down, &*w.lm_head]
            .iter()
            .map(|l| l.size_bytes())
            .sum()
    }

    /// The head's configuration.
    pub fn config(&self) -> &Eagle3Config {
        &self.config
    }

    /// The target layers whose inputs the head reads, in concatenation order: pass them to
    /// [`LlamaModel::forward_with_aux`].
    pub fn aux_layers(&self) -> &[usize] {
        &self.aux_layers
    }

    /// The draft vocabulary and its mapping to target ids.
    pub fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    /// The head's one-layer KV cache layout over the target's pool of `num_blocks` blocks
    /// of `block_size` tokens.
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> peregrine_kernels::cpu::KvLayout {
        self.config.kv_layout(num_blocks, block_size)
    }
}
