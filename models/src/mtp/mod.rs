//! DeepSeek-V3's multi-token prediction layer as a draft head (the DeepSeek-V3 technical
//! report, arXiv 2412.19437, section 2.2), on the CPU:
//!
//! ```text
//! e  = embed(x), 0 at position 0
//! g  = norm(h)   (step 0: the target's last-layer output through its final norm)
//!    = pre       (later steps: the head's own previous output)
//! z  = eh_proj(cat(enorm(e), hnorm(g)))                      [T, H]
//! y  = decoder block(z)   (latent attention, the mixture)     pre = y
//! logits = shared_head.head(shared_head.norm(y))               [rows, vocab]
//! ```
//!
//! Its weights are the checkpoint's `model.layers.{num_hidden_layers}.*`; its attention
//! keeps a one-layer latent cache addressed by the target's block ids and slot mapping.
//! It drafts over the whole vocabulary.

#[cfg(feature = "cuda")]
pub mod cuda;

use crate::config::ModelConfig;
use crate::eagle3::{DraftVocab, FeatureKind, HeadInput, HeadOutput};
use crate::graph::cpu::head::{forward_eagerly, GraphHead, HeadIo};
use crate::graph::cpu::ops::{self as ops, Graph};
use crate::graph::cpu::step_io::{StepInputs, StepShape};
use crate::llama::record::{record_block, record_input_norm, Block};
use crate::llama::{load_layer, rotary_of, ForwardError, Layer, LlamaBuffers};
use crate::weights::{WeightError, Weights};
use peregrine_kernels::cpu::{KvLayout, Matrix};
use peregrine_ops::{AttentionPlan, KvCache, Linear, PagedAttention, RmsNorm, Rotary};
use peregrine_runtime::cpu::{BufferPool, CpuBuffer};
use std::sync::Arc;

/// A multi-token prediction head that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum MtpError {
    #[error(
        "the target has no multi-token prediction layers (its config.json sets no \
         num_nextn_predict_layers): speculative_method mtp needs a DeepSeek-V3-style checkpoint"
    )]
    NoLayers,
    #[error("multi-token prediction layer: {0}")]
    Weight(#[from] WeightError),
}

/// The head's parameters.
struct MtpWeights {
    embed: Arc<Matrix>,
    /// The target's final norm, which the target's output goes through at step 0.
    target_norm: RmsNorm,
    enorm: RmsNorm,
    hnorm: RmsNorm,
    /// `[H, 2H]`.
    eh_proj: Linear,
    layer: Arc<Layer>,
    head_norm: Arc<RmsNorm>,
    /// `[vocab, H]`.
    lm_head: Arc<Linear>,
}

/// A loaded multi-token prediction head over a target of `config`. Its weights are shared
/// (`Arc`) with the graphs that record its forward; its buffers come from its own pool.
pub struct MtpHead {
    config: ModelConfig,
    /// Draft ids are target ids.
    vocab: DraftVocab,
    /// The one target "layer" the head reads: the last layer's output.
    aux: [usize; 1],
    weights: Arc<MtpWeights>,
    rotary: Arc<Rotary>,
    attention: PagedAttention,
    pool: BufferPool,
}

impl MtpHead {
    /// The first multi-token prediction layer of the checkpoint `w` of a target of
    /// `config`, whose embedding table is `target_embed` (used unless the layer has its
    /// own `embed_tokens`) and whose `lm_head` is `target_head` (likewise for
    /// `shared_head.head`). Every tensor's shape is checked.
    pub fn from_weights(
        config: &ModelConfig,
        w: &Weights,
        target_embed: Arc<Matrix>,
        target_head: Arc<Linear>,
    ) -> Result<MtpHead, MtpError> {
        if config.mtp_layers == 0 {
            return Err(MtpError::NoLayers);
        }
        let (l, h, eps) = (
            config.num_layers,
            config.hidden_size,
            config.rms_norm_eps as f32,
        );
        let p = format!("model.layers.{l}");
        let norm = |name: &str| -> Result<RmsNorm, WeightError> {
            Ok(RmsNorm::new(w.f32(&format!("{p}.{name}"), &[h])?, eps))
        };
        let embed = match format!("{p}.embed_tokens.weight") {
            own if w.contains(&own) => Arc::new(w.matrix(&own, [config.vocab_size, h])?),
            _ => target_embed,
        };
        let lm_head = match format!("{p}.shared_head.head.weight") {
            own if w.contains(&own) => Arc::new(Linear::of(
                Arc::new(w.matrix(&own, [config.vocab_size, h])?),
                None,
            )),
            _ => target_head,
        };
        let eh_proj = w.matrix(&format!("{p}.eh_proj.weight"), [h, 2 * h])?;
        let weights = MtpWeights {
            embed,
            target_norm: RmsNorm::new(w.f32("model.norm.weight", &[h])?, eps),
            enorm: norm("enorm.weight")?,
            hnorm: norm("hnorm.weight")?,
            eh_proj: Linear::of(Arc::new(eh_proj), None),
            layer: Arc::new(load_layer(w, config, l)?),
            head_norm: Arc::new(norm("shared_head.norm.weight")?),
            lm_head,
        };
        let identity = vec![0i64; config.vocab_size];
        let vocab = DraftVocab::from_d2t(&identity, config.vocab_size)
            .expect("the identity maps inside the vocabulary");
        Ok(MtpHead {
            config: config.clone(),
            vocab,
            aux: [config.num_layers],
            weights: Arc::new(weights),
            rotary: Arc::new(rotary_of(config)),
            attention: PagedAttention {
                num_heads: config.num_heads,
                scale: 1.0 / (config.head_dim as f32).sqrt(),
            },
            pool: BufferPool::new(),
        })
    }

    /// The head's width H (one row of `pre`, and of the target's output it reads).
    pub fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    /// The target layers whose inputs the head reads at step 0: "layer `num_layers`"
    /// alone, the last layer's output.
    pub fn aux_layers(&self) -> &[usize] {
        &self.aux
    }

    /// Its draft vocabulary: the target's, every draft id its own target id.
    pub fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    /// The head's one-layer cache layout over `num_blocks` blocks of `block_size` tokens
    /// (the target's, one layer of it).
    pub fn kv_layout(&self, num_blocks: u64, block_size: u64) -> KvLayout {
        self.config.kv_layout(num_blocks, block_size)
    }

    /// A one-layer cache of [`kv_layout`](Self::kv_layout), of the kind the target's is.
    pub fn new_cache(&self, num_blocks: u64, block_size: u64) -> KvCache {
        let layout = self.kv_layout(num_blocks, block_size);
        KvCache::try_with(1, layout, self.config.kv_rows())
            .expect("allocating the MTP head's KV cache")
    }

    /// Runs `tokens` (target ids, one per planned row) with features `input` (the target's
    /// last-layer outputs, or each row's previous `pre`) through the head, writing their
    /// latent rows into layer 0 of `cache`, and returns the logits of `logit_rows` and
    /// `pre` of every row.
    pub fn forward(
        &self,
        tokens: &[u32],
        input: HeadInput,
        plan: &AttentionPlan,
        cache: &mut KvCache,
        logit_rows: &[usize],
    ) -> Result<HeadOutput, ForwardError> {
        let vocab = self.config.vocab_size;
        forward_eagerly(self, vocab, tokens, input, plan, cache, logit_rows)
    }

    /// Records the head's forward of a step of `shape` over `b`.
    fn record_step(
        &self,
        graph: &mut Graph,
        b: &MtpBuffers,
        shape: StepShape,
    ) -> Result<(), ForwardError> {
        let cap = b.block.inputs.capacity;
        if shape.rows > cap.rows || shape.seqs > cap.seqs || shape.logit_rows > cap.logit_rows {
            return Err(ForwardError::TokenCount {
                tokens: shape.rows,
                rows: cap.rows,
            });
        }
        let (w, a, n, h) = (
            &self.weights,
            &b.block.act,
            shape.rows,
            self.config.hidden_size,
        );
        ops::embedding(graph, &b.block.inputs, &w.embed, &b.e, n, h);
        self.record_input(graph, b, b.kind, n);
        ops::linear(graph, "eh_proj", w, |w| &w.eh_proj, &b.u, &a.residual, n);
        ops::rotary_tables(graph, &b.block.inputs, a, &self.rotary, n);
        record_input_norm(graph, &b.block, n, &w.layer, true);
        let block = Block {
            layer: &w.layer,
            rotary: &self.rotary,
            attention: self.attention,
            cache_layer: 0,
        };
        record_block(graph, &b.block, shape, block)?;
        let (inputs, out) = (&b.block.inputs, &b.block.logits);
        ops::logits(graph, inputs, a, &w.head_norm, &w.lm_head, out, shape);
        Ok(())
    }

    /// `u = cat(enorm(e), hnorm(g))` of the first `n` rows, `e` zeroed at position 0 and
    /// `g` the feature, through the target's final norm at step 0.
    fn record_input(&self, graph: &mut Graph, b: &MtpBuffers, kind: FeatureKind, n: usize) {
        let h = self.config.hidden_size;
        let (w, e, feature) = (self.weights.clone(), b.e.clone(), b.feature.clone());
        let (positions, g, u) = (b.block.inputs.positions.clone(), b.g.clone(), b.u.clone());
        let handles = [
            e.handle(),
            feature.handle(),
            positions.handle(),
            g.handle(),
            u.handle(),
        ];
        graph.record("mtp_input", &handles, move |_| {
            let (mut e, mut g, mut u) = (e.write(), g.write(), u.write());
            let positions = &positions.read()[..n];
            for (row, &p) in e[..n * h].chunks_mut(h).zip(positions) {
                if p == 0 {
                    row.fill(0.0);
                }
            }
            let feature = &feature.read()[..n * h];
            match kind {
                FeatureKind::Aux => w.target_norm.forward(feature, &mut g[..n * h]),
                FeatureKind::Pre => g[..n * h].copy_from_slice(feature),
            }
            for (t, out) in u[..n * 2 * h].chunks_mut(2 * h).enumerate() {
                let (left, right) = out.split_at_mut(h);
                w.enorm.forward(&e[t * h..(t + 1) * h], left);
                w.hnorm.forward(&g[t * h..(t + 1) * h], right);
            }
            Ok(())
        });
    }
}

/// Everything a forward of the head reads and writes besides its weights and cache, each
/// at the largest step it serves.
pub struct MtpBuffers {
    /// The decoder block's buffers (the staged inputs, its activations, the logits).
    block: LlamaBuffers,
    /// Which feature the rows are fed.
    kind: FeatureKind,
    /// `[rows, H]` the staged feature of each row.
    feature: CpuBuffer<f32>,
    /// `[rows, H]` the embeddings, then `g`.
    e: CpuBuffer<f32>,
    g: CpuBuffer<f32>,
    /// `[rows, 2H]` the input of `eh_proj`.
    u: CpuBuffer<f32>,
}

impl HeadIo for MtpBuffers {
    fn inputs(&self) -> &StepInputs {
        &self.block.inputs
    }

    fn feature(&self) -> &CpuBuffer<f32> {
        &self.feature
    }

    fn logits(&self) -> &CpuBuffer<f32> {
        &self.block.logits
    }

    fn pre(&self) -> &CpuBuffer<f32> {
        &self.block.act.residual
    }
}

impl GraphHead for MtpHead {
    type Buffers = MtpBuffers;

    fn feature_width(&self, _kind: FeatureKind) -> usize {
        self.config.hidden_size
    }

    fn buffers(&self, capacity: StepShape, max_blocks: usize, kind: FeatureKind) -> MtpBuffers {
        let (pool, n, h) = (&self.pool, capacity.rows, self.config.hidden_size);
        let inputs = StepInputs::new(pool, capacity, max_blocks);
        MtpBuffers {
            block: LlamaBuffers::new(pool, &self.config, inputs, 0),
            kind,
            feature: pool.alloc(n * h),
            e: pool.alloc(n * h),
            g: pool.alloc(n * h),
            u: pool.alloc(n * 2 * h),
        }
    }

    fn record(
        &self,
        graph: &mut Graph,
        b: &MtpBuffers,
        shape: StepShape,
    ) -> Result<(), ForwardError> {
        self.record_step(graph, b, shape)
    }
}
