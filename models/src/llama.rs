//! The Llama family (Llama, Mistral, Qwen2, Qwen3) over a paged KV cache.

use crate::config::ModelConfig;
use crate::weights::{WeightError, Weights};
use peregrine_kernels::cpu::{embedding, silu_and_mul, KvLayout};
use peregrine_ops::{
    AttentionPlan, KvCache, Linear, PagedAttention, PlanError, RmsNorm, Rotary, RotaryLayout,
};
use std::path::Path;
use std::sync::Arc;

/// A forward pass that cannot run, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("{tokens} tokens were given for a plan of {rows} rows")]
    TokenCount { tokens: usize, rows: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenId { id: u32, vocab: usize },
    #[error("logits were asked for row {row} of a step of {rows} rows")]
    LogitRow { row: usize, rows: usize },
    #[error("hidden states of layer {layer} were asked for a model of {layers} layers")]
    AuxLayer { layer: usize, layers: usize },
    #[error("{what} holds {len} values; {rows} rows of {width} were expected")]
    HiddenShape {
        what: &'static str,
        len: usize,
        rows: usize,
        width: usize,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

struct Layer {
    input_norm: RmsNorm,
    qkv: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    o_proj: Linear,
    post_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
}

/// A loaded Llama-family model. Weights are held as float32 on the CPU; q/k/v and
/// gate/up are fused into one matrix each.
pub struct LlamaModel {
    config: ModelConfig,
    embed: Arc<[f32]>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: Rotary,
    attention: PagedAttention,
}

impl LlamaModel {
    /// Loads the model in `dir` (config.json and safetensors).
    pub fn load(dir: &Path) -> anyhow::Result<LlamaModel> {
        let config = ModelConfig::from_dir(dir)?;
        let weights = Weights::open(dir)?;
        Ok(LlamaModel::from_weights(config, &weights)?)
    }

    /// Builds the model from an opened checkpoint, checking every tensor's shape.
    pub fn from_weights(config: ModelConfig, w: &Weights) -> Result<LlamaModel, WeightError> {
        let c = &config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let eps = c.rms_norm_eps as f32;
        let embed: Arc<[f32]> = w
            .f32("model.embed_tokens.weight", &[c.vocab_size, h])?
            .into();
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}");
            let get = |name: &str, shape: &[usize]| w.f32(&format!("{p}.{name}"), shape);
            let mut qkv = get("self_attn.q_proj.weight", &[qd, h])?;
            qkv.extend(get("self_attn.k_proj.weight", &[kvd, h])?);
            qkv.extend(get("self_attn.v_proj.weight", &[kvd, h])?);
            let qkv_bias = if c.qkv_bias {
                let mut b = get("self_attn.q_proj.bias", &[qd])?;
                b.extend(get("self_attn.k_proj.bias", &[kvd])?);
                b.extend(get("self_attn.v_proj.bias", &[kvd])?);
                Some(b)
            } else {
                None
            };
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(RmsNorm::new(get("self_attn.q_norm.weight", &[d])?, eps)),
                    Some(RmsNorm::new(get("self_attn.k_norm.weight", &[d])?, eps)),
                )
            } else {
                (None, None)
            };
            let mut gate_up = get("mlp.gate_proj.weight", &[c.intermediate_size, h])?;
            gate_up.extend(get("mlp.up_proj.weight", &[c.intermediate_size, h])?);
            layers.push(Layer {
                input_norm: RmsNorm::new(get("input_layernorm.weight", &[h])?, eps),
                qkv: Linear::new(qkv.into(), qkv_bias, qd + 2 * kvd),
                q_norm,
                k_norm,
                o_proj: Linear::new(get("self_attn.o_proj.weight", &[h, qd])?.into(), None, h),
                post_norm: RmsNorm::new(get("post_attention_layernorm.weight", &[h])?, eps),
                gate_up: Linear::new(gate_up.into(), None, 2 * c.intermediate_size),
                down: Linear::new(
                    get("mlp.down_proj.weight", &[h, c.intermediate_size])?.into(),
                    None,
                    h,
                ),
            });
        }
        let lm_head = if c.tie_word_embeddings && !w.contains("lm_head.weight") {
            Linear::new(embed.clone(), None, c.vocab_size)
        } else {
            Linear::new(
                w.f32("lm_head.weight", &[c.vocab_size, h])?.into(),
                None,
                c.vocab_size,
            )
        };
        let rotary = Rotary::new(d, c.rope_theta, &c.rope_scaling, RotaryLayout::HalfSplit);
        Ok(LlamaModel {
            norm: RmsNorm::new(w.f32("model.norm.weight", &[h])?, eps),
            attention: PagedAttention {
                num_heads: c.num_heads,
                scale: 1.0 / (d as f32).sqrt(),
            },
            config,
            embed,
            layers,
            lm_head,
            rotary,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The token embedding table, `[vocab_size, hidden_size]` row-major (shared, not
    /// copied: an EAGLE-3 head without its own `embed_tokens` uses it).
    pub fn embedding_table(&self) -> Arc<[f32]> {
        self.embed.clone()
    }

    /// Bytes of parameters held.
    pub fn weight_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.size_bytes()
                    + l.o_proj.size_bytes()
                    + l.gate_up.size_bytes()
                    + l.down.size_bytes()
            })
            .sum();
        let tied = Arc::ptr_eq(&self.embed, &self.lm_head.weight());
        let head = if tied { 0 } else { self.lm_head.size_bytes() };
        layers + 4 * self.embed.len() as u64 + head
    }

    /// A KV cache layout of `num_blocks` blocks of `block_size` tokens for this model.
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.config.kv_layout(num_blocks, block_size)
    }

    /// Bytes of K and V one token takes across all layers.
    pub fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.config;
        (2 * c.num_layers * c.num_kv_heads * c.head_dim * 4) as u64
    }

    /// Runs `tokens` (one per planned row) through the model, writing their keys and values
    /// into `cache`, and returns the logits (`[logit_rows.len(), vocab]`) of the rows named
    /// in `logit_rows`.
    pub fn forward(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
    ) -> Result<Vec<f32>, ForwardError> {
        self.run(tokens, plan, cache, logit_rows, &[], &mut [])
    }

    /// [`forward`](Self::forward) that also records, for every row, the residual-stream
    /// input of each layer in `aux_layers` (layer 0's input is the embedding; layer l's is
    /// the residual after layer l-1's output was added): the hidden states an EAGLE-3 head
    /// reads. They come back concatenated in the order of `aux_layers`, as
    /// `[tokens, aux_layers.len() * hidden_size]`, next to the logits. Recording copies
    /// rows during the one forward; it changes nothing the forward computes.
    pub fn forward_with_aux(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
        aux_layers: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>), ForwardError> {
        let layers = self.config.num_layers;
        if let Some(&layer) = aux_layers.iter().find(|&&l| l >= layers) {
            return Err(ForwardError::AuxLayer { layer, layers });
        }
        let mut aux = vec![0.0; tokens.len() * aux_layers.len() * self.config.hidden_size];
        let logits = self.run(tokens, plan, cache, logit_rows, aux_layers, &mut aux)?;
        Ok((logits, aux))
    }

    /// The forward; `aux` (`[tokens, aux_layers.len() * hidden]`) receives the inputs of
    /// the layers in `aux_layers`, which the caller has checked.
    fn run(
        &self,
        tokens: &[u32],
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
        aux_layers: &[usize],
        aux: &mut [f32],
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        check_inputs(tokens, plan, logit_rows, c.vocab_size)?;
        let n = tokens.len();
        let (h, d) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let tables = self.rotary.tables(plan.positions());
        let mut residual = vec![0.0; n * h];
        embedding(tokens, &self.embed, h, &mut residual);
        let mut normed = vec![0.0; n * h];
        let mut delta = vec![0.0; n * h];
        let mut qkv = vec![0.0; n * (qd + 2 * kvd)];
        let (mut q, mut k, mut v) = (vec![0.0; n * qd], vec![0.0; n * kvd], vec![0.0; n * kvd]);
        let mut attn = vec![0.0; n * qd];
        let mut gate_up = vec![0.0; n * 2 * c.intermediate_size];
        let mut act = vec![0.0; n * c.intermediate_size];
        for (l, layer) in self.layers.iter().enumerate() {
            if l == 0 {
                layer.input_norm.forward(&residual, &mut normed);
            } else {
                layer
                    .input_norm
                    .forward_residual(&mut residual, &delta, &mut normed);
            }
            record_layer_input(l, aux_layers, &residual, h, aux);
            layer.qkv.forward(&normed, &mut qkv);
            for (r, row) in qkv.chunks(qd + 2 * kvd).enumerate() {
                q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
            }
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                qn.forward_in_place(&mut q);
                kn.forward_in_place(&mut k);
            }
            self.rotary.apply(&mut q, &tables);
            self.rotary.apply(&mut k, &tables);
            cache.write(l, plan.slot_mapping(), &k, &v);
            self.attention.forward(&q, &mut attn, cache, l, plan)?;
            layer.o_proj.forward(&attn, &mut delta);
            layer
                .post_norm
                .forward_residual(&mut residual, &delta, &mut normed);
            layer.gate_up.forward(&normed, &mut gate_up);
            silu_and_mul(&gate_up, c.intermediate_size, &mut act);
            layer.down.forward(&act, &mut delta);
        }
        residual.iter_mut().zip(&delta).for_each(|(r, d)| *r += d);
        Ok(row_logits(
            &residual,
            h,
            logit_rows,
            &self.norm,
            &self.lm_head,
            c.vocab_size,
        ))
    }
}

/// Copies `residual` (`[rows, h]`, the input of layer `layer`) into every slot of `aux`
/// (`[rows, aux_layers.len() * h]`) that `aux_layers` gives to that layer.
fn record_layer_input(
    layer: usize,
    aux_layers: &[usize],
    residual: &[f32],
    h: usize,
    aux: &mut [f32],
) {
    let width = aux_layers.len() * h;
    for (slot, _) in aux_layers.iter().enumerate().filter(|(_, &l)| l == layer) {
        for (row, out) in residual.chunks(h).zip(aux.chunks_mut(width)) {
            out[slot * h..(slot + 1) * h].copy_from_slice(row);
        }
    }
}

/// The logits (`[rows.len(), vocab]`) of the rows `rows` of the final residual stream
/// (`[_, hidden]`): the final norm, then the head.
pub(crate) fn row_logits(
    residual: &[f32],
    hidden: usize,
    rows: &[usize],
    norm: &RmsNorm,
    head: &Linear,
    vocab: usize,
) -> Vec<f32> {
    let picked: Vec<f32> = rows
        .iter()
        .flat_map(|&r| residual[r * hidden..(r + 1) * hidden].iter().copied())
        .collect();
    let mut normed = vec![0.0; picked.len()];
    norm.forward(&picked, &mut normed);
    let mut logits = vec![0.0; rows.len() * vocab];
    head.forward(&normed, &mut logits);
    logits
}

/// Checks a forward's inputs against the plan and the vocabulary, before any work.
pub(crate) fn check_inputs(
    tokens: &[u32],
    plan: &AttentionPlan,
    logit_rows: &[usize],
    vocab: usize,
) -> Result<(), ForwardError> {
    let n = tokens.len();
    if n != plan.rows() {
        return Err(ForwardError::TokenCount {
            tokens: n,
            rows: plan.rows(),
        });
    }
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ForwardError::TokenId { id, vocab });
    }
    if let Some(&row) = logit_rows.iter().find(|&&r| r >= n) {
        return Err(ForwardError::LogitRow { row, rows: n });
    }
    Ok(())
}
