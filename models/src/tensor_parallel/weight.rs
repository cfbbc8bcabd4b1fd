//! The Llama-family weights, as the checkpoint names them and as [`LlamaModel`] holds
//! them (q/k/v stacked into one matrix, gate/up into another), and each rank's cut of them.
//!
//! [`LlamaModel`]: crate::LlamaModel

use super::{Cut, RankShard, TpShape};
use std::ops::Range;

/// A weight of a Llama-family model. Every projection is stored `[out_features,
/// in_features]`, row-major. A bias (q/k/v's, Qwen2's) is cut as its weight's rows, as a
/// matrix of one column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaWeight {
    /// `self_attn.q_proj`, `[num_heads * head_dim, hidden]`: column-parallel.
    QProj,
    /// `self_attn.k_proj`, `[num_kv_heads * head_dim, hidden]`: column-parallel by KV head.
    KProj,
    /// `self_attn.v_proj`, as `KProj`.
    VProj,
    /// q, k and v stacked (the model's `qkv`): each rank's q rows, then its k rows, then
    /// its v rows.
    Qkv,
    /// `self_attn.o_proj`, `[hidden, num_heads * head_dim]`: row-parallel.
    OProj,
    /// `mlp.gate_proj`, `[intermediate, hidden]`: column-parallel.
    GateProj,
    /// `mlp.up_proj`, as `GateProj`.
    UpProj,
    /// gate and up stacked (the model's `gate_up`): the rank's gate rows, then its up rows.
    GateUp,
    /// `mlp.down_proj`, `[hidden, intermediate]`: row-parallel.
    DownProj,
    /// `model.embed_tokens`, `[vocab, hidden]`: vocabulary-parallel.
    EmbedTokens,
    /// `lm_head`, `[vocab, hidden]`: vocabulary-parallel (tied: the embedding's cut).
    LmHead,
    /// An RMSNorm's weight (`input_layernorm`, `post_attention_layernorm`, `model.norm`,
    /// Qwen3's per-head `q_norm` and `k_norm`): replicated.
    Norm,
}

impl LlamaWeight {
    /// The weight a checkpoint tensor name stands for (`model.layers.3.self_attn.q_proj.weight`,
    /// `...q_proj.bias`, `lm_head.weight`...), or `None` for a name outside the Llama family.
    pub fn from_name(name: &str) -> Option<LlamaWeight> {
        let stem = name
            .strip_suffix(".weight")
            .or_else(|| name.strip_suffix(".bias"))?;
        let last = stem.rsplit('.').next()?;
        Some(match last {
            "q_proj" => LlamaWeight::QProj,
            "k_proj" => LlamaWeight::KProj,
            "v_proj" => LlamaWeight::VProj,
            "o_proj" => LlamaWeight::OProj,
            "gate_proj" => LlamaWeight::GateProj,
            "up_proj" => LlamaWeight::UpProj,
            "down_proj" => LlamaWeight::DownProj,
            "embed_tokens" => LlamaWeight::EmbedTokens,
            "lm_head" => LlamaWeight::LmHead,
            "input_layernorm" | "post_attention_layernorm" | "norm" | "q_norm" | "k_norm" => {
                LlamaWeight::Norm
            }
            _ => return None,
        })
    }

    /// The full weight's shape, `[rows, cols]`, in a model of shape `s` (a norm's: the
    /// hidden size; a per-head norm's is `[head_dim, 1]`, replicated as well).
    pub fn shape(self, s: &TpShape) -> [usize; 2] {
        let (h, i, v) = (s.hidden_size, s.intermediate_size, s.vocab_size);
        match self {
            LlamaWeight::QProj => [s.q_width(), h],
            LlamaWeight::KProj | LlamaWeight::VProj => [s.kv_width(), h],
            LlamaWeight::Qkv => [s.q_width() + 2 * s.kv_width(), h],
            LlamaWeight::OProj => [h, s.q_width()],
            LlamaWeight::GateProj | LlamaWeight::UpProj => [i, h],
            LlamaWeight::GateUp => [2 * i, h],
            LlamaWeight::DownProj => [h, i],
            LlamaWeight::EmbedTokens | LlamaWeight::LmHead => [v, h],
            LlamaWeight::Norm => [h, 1],
        }
    }
}

/// `heads` of `head_dim` each, as rows or columns, `offset` further on.
fn heads(heads: Range<usize>, head_dim: usize, offset: usize) -> Range<usize> {
    offset + heads.start * head_dim..offset + heads.end * head_dim
}

impl RankShard {
    /// This rank's cut of `weight`.
    pub fn cut_of(&self, weight: LlamaWeight) -> Cut {
        let s = &self.shape;
        let d = s.head_dim;
        let rows = |ranges| Cut::Rows { ranges, pad: 0 };
        let (q, kv) = (heads(self.q_heads(), d, 0), self.kv_heads());
        let inter = self.inter();
        match weight {
            LlamaWeight::QProj => rows(vec![q]),
            LlamaWeight::KProj | LlamaWeight::VProj => rows(vec![heads(kv, d, 0)]),
            LlamaWeight::Qkv => rows(vec![
                q,
                heads(kv.clone(), d, s.q_width()),
                heads(kv, d, s.q_width() + s.kv_width()),
            ]),
            LlamaWeight::OProj => Cut::Columns(vec![q]),
            LlamaWeight::GateProj | LlamaWeight::UpProj => rows(vec![inter]),
            LlamaWeight::GateUp => {
                let up = s.intermediate_size + inter.start..s.intermediate_size + inter.end;
                rows(vec![inter, up])
            }
            LlamaWeight::DownProj => Cut::Columns(vec![inter]),
            LlamaWeight::EmbedTokens | LlamaWeight::LmHead => {
                let vocab = self.vocab();
                Cut::Rows {
                    pad: self.vocab_rows() - vocab.len(),
                    ranges: vec![vocab],
                }
            }
            LlamaWeight::Norm => Cut::Replicated,
        }
    }
}
