//! Decoder-only models over a paged KV cache: the Llama family (Llama, Mistral, Qwen2,
//! Qwen3) and the DeepSeek family (DeepSeek-V2/V3 with latent attention, Qwen3-MoE), whose
//! layers differ only in their attention (grouped-query or latent) and MLP (dense or a
//! mixture of experts).

#[cfg(feature = "cuda")]
pub mod cuda;
mod mla;
mod mlp;
mod moe;
pub(crate) mod record;

pub use record::LlamaBuffers;

use crate::config::ModelConfig;
use crate::graph::cpu::step_io::{StepInputs, StepShape, StepStaging};
use crate::progress;
use crate::weights::{WeightError, Weights};
use mla::MlaWeights;
use mlp::GatedMlp;
use moe::MoeWeights;
use peregrine_kernels::cpu::{KvLayout, Matrix};
use peregrine_ops::{
    AttentionPlan, KvCache, KvRows, Linear, PagedAttention, PlanError, RmsNorm, Rotary,
    RotaryLayout,
};
use peregrine_runtime::cpu::{BufferPool, CpuGraph, GraphError};
use peregrine_runtime::StageError;
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
    #[error("hidden states of layer {layer} were asked for a model of {layers} layers (at most layer {layers}: the last layer's output)")]
    AuxLayer { layer: usize, layers: usize },
    #[error("{what} holds {len} values; {rows} rows of {width} were expected")]
    HiddenShape {
        what: &'static str,
        len: usize,
        rows: usize,
        width: usize,
    },
    #[error("features in a GPU's feature ring were given to a forward on the CPU")]
    DeviceFeatures,
    #[error("sequence {seq}: a block table of {blocks} blocks, past the {max} staged")]
    TableWidth {
        seq: usize,
        blocks: usize,
        max: usize,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// One decoder layer: a norm, the attention, a norm, the MLP.
pub(crate) struct Layer {
    input_norm: RmsNorm,
    attention: LayerAttention,
    post_norm: RmsNorm,
    mlp: LayerMlp,
}

/// A layer's attention.
enum LayerAttention {
    /// Grouped-query attention over keys and values (the Llama family, Qwen3-MoE).
    Grouped(Arc<GroupedAttention>),
    /// Multi-head latent attention over one latent row a token (DeepSeek).
    Latent(Arc<MlaWeights>),
}

/// Grouped-query attention's weights: q/k/v stacked, Qwen3's per-head q/k norms.
struct GroupedAttention {
    qkv: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    o_proj: Linear,
}

/// A layer's MLP.
enum LayerMlp {
    Dense(Arc<GatedMlp>),
    Experts(Arc<MoeWeights>),
}

impl Layer {
    /// The layer's projections as stored.
    fn linears(&self) -> Vec<&Linear> {
        let mut all = match &self.attention {
            LayerAttention::Grouped(g) => vec![&g.qkv, &g.o_proj],
            LayerAttention::Latent(m) => m.linears(),
        };
        match &self.mlp {
            LayerMlp::Dense(mlp) => all.extend([&mlp.gate_up, &mlp.down]),
            LayerMlp::Experts(moe) => all.extend(moe.linears()),
        }
        all
    }
}

/// A loaded Llama-family model. Weight matrices are held on the CPU as they are stored
/// (float32, bf16, f16 or ggml block quantizations; see [`Matrix`]); q/k/v and gate/up are
/// stacked into one matrix each. Weights are shared (`Arc`) with the graphs that record the
/// forward; its buffers come from its own pool.
pub struct LlamaModel {
    config: ModelConfig,
    embed: Arc<Matrix>,
    layers: Vec<Arc<Layer>>,
    norm: Arc<RmsNorm>,
    lm_head: Arc<Linear>,
    rotary: Arc<Rotary>,
    attention: PagedAttention,
    pool: BufferPool,
}

impl LlamaModel {
    /// Loads the model in `dir` (config.json and safetensors).
    pub fn load(dir: &Path) -> anyhow::Result<LlamaModel> {
        let config = ModelConfig::from_dir(dir)?;
        let weights = Weights::open(dir)?;
        Ok(LlamaModel::from_weights(config, &weights)?)
    }

    /// Builds the model from an opened checkpoint, checking every tensor's shape; a bar on
    /// stderr counts the layers loaded.
    pub fn from_weights(config: ModelConfig, w: &Weights) -> Result<LlamaModel, WeightError> {
        let c = &config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let eps = c.rms_norm_eps as f32;
        let bar = progress::bar(c.num_layers as u64, "loading weights", "layers");
        let embed = Arc::new(w.matrix("model.embed_tokens.weight", [c.vocab_size, h])?);
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            layers.push(Arc::new(load_layer(w, c, l)?));
            bar.inc(1);
        }
        let lm_head = if c.tie_word_embeddings && !w.contains("lm_head.weight") {
            Linear::of(embed.clone(), None)
        } else {
            Linear::of(
                Arc::new(w.matrix("lm_head.weight", [c.vocab_size, h])?),
                None,
            )
        };
        let rotary = rotary_of(c);
        let norm = Arc::new(RmsNorm::new(w.f32("model.norm.weight", &[h])?, eps));
        progress::finish(
            &bar,
            &format!("loaded the weights of {} layers", c.num_layers),
        );
        Ok(LlamaModel {
            norm,
            attention: PagedAttention {
                num_heads: c.num_heads,
                scale: 1.0 / (d as f32).sqrt(),
            },
            config,
            embed,
            layers,
            lm_head: Arc::new(lm_head),
            rotary: Arc::new(rotary),
            pool: BufferPool::new(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The token embedding table, `[vocab_size, hidden_size]` (shared, not copied: an
    /// EAGLE-3 head without its own `embed_tokens` uses it).
    pub fn embedding_table(&self) -> Arc<Matrix> {
        self.embed.clone()
    }

    /// The output projection, `[vocab_size, hidden_size]` (shared: an MTP head without its
    /// own `shared_head.head` uses it).
    pub fn lm_head(&self) -> Arc<Linear> {
        self.lm_head.clone()
    }

    /// Bytes of parameters held.
    pub fn weight_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .map(Linear::size_bytes)
            .sum();
        let tied = Arc::ptr_eq(&self.embed, self.lm_head.matrix());
        let head = if tied { 0 } else { self.lm_head.size_bytes() };
        layers + self.embed.size_bytes() + head
    }

    /// How the weight matrices are stored, each form once in order of first use, e.g.
    /// `"Q8_0, Q4_1"`.
    pub fn weight_storage(&self) -> String {
        let mut forms: Vec<String> = Vec::new();
        let matrices = self.layers.iter().flat_map(|l| {
            l.linears()
                .into_iter()
                .map(|linear| linear.matrix().clone())
        });
        for m in std::iter::once(self.embed.clone()).chain(matrices) {
            for form in m.storage_names() {
                if !forms.iter().any(|f| f == form) {
                    forms.push(form.to_string());
                }
            }
        }
        forms.join(", ")
    }

    /// A KV cache layout of `num_blocks` blocks of `block_size` tokens for this model.
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.config.kv_layout(num_blocks, block_size)
    }

    /// Bytes of K and V (or of the latent) one token takes across all layers.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.config.kv_bytes_per_token(4)
    }

    /// What a token leaves in each layer's cache.
    pub fn kv_rows(&self) -> KvRows {
        self.config.kv_rows()
    }

    /// A KV cache of `num_blocks` blocks of `block_size` tokens for every layer (panics if
    /// the host cannot give it).
    pub fn new_cache(&self, num_blocks: u64, block_size: u64) -> KvCache {
        let layout = self.kv_layout(num_blocks, block_size);
        KvCache::try_with(self.config.num_layers, layout, self.kv_rows())
            .expect("allocating the KV cache")
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
    /// the residual after layer l-1's output was added; layer `num_layers`'s, the residual
    /// after the last layer's): the hidden states an EAGLE-3 or MTP head reads. They come back concatenated in the order of `aux_layers`, as
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
        if let Some(&layer) = aux_layers.iter().find(|&&l| l > layers) {
            return Err(ForwardError::AuxLayer { layer, layers });
        }
        let mut aux = vec![0.0; tokens.len() * aux_layers.len() * self.config.hidden_size];
        let logits = self.run(tokens, plan, cache, logit_rows, aux_layers, &mut aux)?;
        Ok((logits, aux))
    }

    /// The forward: stages the step at its own size into buffers from the model's pool,
    /// records it into a graph and replays that once (a captured graph replays the same
    /// recording). `aux` (`[tokens, aux_layers.len() * hidden]`) receives the inputs of
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
        check_inputs(tokens, plan, logit_rows, self.config.vocab_size)?;
        let (shape, max_blocks) = StepShape::of(tokens, plan, logit_rows);
        let buffers = self.buffers(shape, max_blocks, aux_layers.len());
        StepStaging::new(shape, max_blocks, -1)?.stage(
            &buffers.inputs,
            tokens,
            plan,
            logit_rows,
            shape,
        )?;
        let mut graph = CpuGraph::new();
        self.record(&mut graph, &buffers, shape, aux_layers)?;
        graph.replay(cache)?;
        aux.copy_from_slice(&buffers.aux.read());
        let logits = buffers.logits.read().to_vec();
        Ok(logits)
    }

    /// The buffers a forward of up to `capacity` reads and writes, from the model's pool,
    /// with block tables of `max_blocks` and room for the inputs of `aux_layers` layers.
    pub fn buffers(
        &self,
        capacity: StepShape,
        max_blocks: usize,
        aux_layers: usize,
    ) -> LlamaBuffers {
        let inputs = StepInputs::new(&self.pool, capacity, max_blocks);
        LlamaBuffers::new(&self.pool, &self.config, inputs, aux_layers)
    }

    /// The pool the model's buffers come from.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }
}

/// Layer `l` of the checkpoint (`model.layers.{l}`): a decoder layer, or a multi-token
/// prediction layer's decoder block past the last one.
pub(crate) fn load_layer(w: &Weights, c: &ModelConfig, l: usize) -> Result<Layer, WeightError> {
    let (p, h, eps) = (
        format!("model.layers.{l}"),
        c.hidden_size,
        c.rms_norm_eps as f32,
    );
    let norm = |name: &str| -> Result<RmsNorm, WeightError> {
        Ok(RmsNorm::new(w.f32(&format!("{p}.{name}"), &[h])?, eps))
    };
    let attention = match c.mla {
        Some(_) => LayerAttention::Latent(Arc::new(MlaWeights::load(w, c, &p)?)),
        None => LayerAttention::Grouped(Arc::new(grouped_attention(w, c, &p)?)),
    };
    let mlp = match &c.moe {
        Some(moe) if moe.layers.get(l) == Some(&true) => {
            LayerMlp::Experts(Arc::new(MoeWeights::load(w, c, &p)?))
        }
        _ => {
            let mlp = GatedMlp::load(w, &format!("{p}.mlp"), h, c.intermediate_size)?;
            LayerMlp::Dense(Arc::new(mlp))
        }
    };
    Ok(Layer {
        input_norm: norm("input_layernorm.weight")?,
        attention,
        post_norm: norm("post_attention_layernorm.weight")?,
        mlp,
    })
}

/// The rotary embedding of `c`'s attention: over the whole head, or latent attention's
/// rotary part (interleaved pairs unless `rope_interleave` is false).
pub(crate) fn rotary_of(c: &ModelConfig) -> Rotary {
    match &c.mla {
        Some(m) => {
            let layout = if m.rope_interleaved {
                RotaryLayout::Interleaved
            } else {
                RotaryLayout::HalfSplit
            };
            Rotary::new(m.qk_rope_head_dim, c.rope_theta, &c.rope_scaling, layout)
        }
        None => Rotary::new(
            c.head_dim,
            c.rope_theta,
            &c.rope_scaling,
            RotaryLayout::HalfSplit,
        ),
    }
}

/// Grouped-query attention's weights of layer `p`.
fn grouped_attention(
    w: &Weights,
    c: &ModelConfig,
    p: &str,
) -> Result<GroupedAttention, WeightError> {
    let (h, d) = (c.hidden_size, c.head_dim);
    let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
    let eps = c.rms_norm_eps as f32;
    let get = |name: &str, shape: &[usize]| w.f32(&format!("{p}.{name}"), shape);
    let matrix = |name: &str, shape: [usize; 2]| w.matrix(&format!("{p}.{name}"), shape);
    let parts = vec![
        matrix("self_attn.q_proj.weight", [qd, h])?,
        matrix("self_attn.k_proj.weight", [kvd, h])?,
        matrix("self_attn.v_proj.weight", [kvd, h])?,
    ];
    let qkv = Matrix::stack(parts).map_err(|source| WeightError::Matrix {
        name: format!("{p}.self_attn.q_proj.weight"),
        source,
    })?;
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
    Ok(GroupedAttention {
        qkv: Linear::of(Arc::new(qkv), qkv_bias),
        q_norm,
        k_norm,
        o_proj: Linear::of(Arc::new(matrix("self_attn.o_proj.weight", [h, qd])?), None),
    })
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
