//! The closed sets of values some fields take: the device and the weights' dtype.

use serde::Deserialize;

/// The device the model runs on.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU backend (always built).
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
}

impl DeviceKind {
    /// The name used by the flag and the file.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// The dtype this device's backend computes in: float32 on the CPU, bfloat16 on the
    /// GPU. `auto` means this one; any other choice is refused.
    pub fn compute_dtype(self) -> DtypeChoice {
        match self {
            DeviceKind::Cpu => DtypeChoice::Float32,
            DeviceKind::Cuda => DtypeChoice::Bfloat16,
        }
    }
}

/// How draft tokens are proposed for speculative decoding.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethod {
    /// Prompt lookup over the request's own tokens; no model.
    Ngram,
    /// A smaller model with the same tokenizer (`draft_model`).
    #[value(name = "draft_model")]
    DraftModel,
    /// An EAGLE-3 head (`draft_model`; with the default model, the head shipped for it).
    Eagle3,
    /// The target's own multi-token prediction layers (DeepSeek-V3's
    /// `num_nextn_predict_layers`), chained for more than one draft.
    Mtp,
}

impl SpeculativeMethod {
    /// The name used by the flag and the file.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeculativeMethod::Ngram => "ngram",
            SpeculativeMethod::DraftModel => "draft_model",
            SpeculativeMethod::Eagle3 => "eagle3",
            SpeculativeMethod::Mtp => "mtp",
        }
    }
}

/// The format a model writes tool calls in, by vLLM's `--tool-call-parser` names.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Qwen2.5, Qwen3, Hermes,
    /// SmolLM2).
    Hermes,
    /// A bare `{"name": ..., "parameters": ...}` object (Llama 3.1 to 3.3).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// `[TOOL_CALLS][...]` (Mistral).
    Mistral,
    /// DeepSeek-V3's `<｜tool▁calls▁begin｜>` blocks.
    #[value(name = "deepseek_v3")]
    DeepseekV3,
}

impl ToolCallParser {
    /// The name used by the flag and the file.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallParser::Hermes => "hermes",
            ToolCallParser::Llama3Json => "llama3_json",
            ToolCallParser::Mistral => "mistral",
            ToolCallParser::DeepseekV3 => "deepseek_v3",
        }
    }
}

/// The dtype the weights and activations are computed in. Each backend computes in one
/// ([`DeviceKind::compute_dtype`]); `--dtype` names it or says `auto`.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// The model's own dtype where the device supports it.
    Auto,
    /// bfloat16.
    Bfloat16,
    /// IEEE half precision.
    Float16,
    /// IEEE single precision.
    Float32,
}

impl DtypeChoice {
    /// The name used by the flag and the file.
    pub fn as_str(self) -> &'static str {
        match self {
            DtypeChoice::Auto => "auto",
            DtypeChoice::Bfloat16 => "bfloat16",
            DtypeChoice::Float16 => "float16",
            DtypeChoice::Float32 => "float32",
        }
    }
}
