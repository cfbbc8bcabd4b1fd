//! Model architectures (the Llama and DeepSeek families, EAGLE-3 and MTP draft heads), Hugging Face config parsing, safetensors loading, GGUF import,
//! tokenizers and chat templates.

pub mod chat_template;
pub mod config;
pub mod cpu_graph;
#[cfg(feature = "cuda")]
pub mod draft_head_kind;
pub mod eagle3;
pub mod fetch;
pub mod gguf;
#[cfg(feature = "cuda")]
pub mod gpu_draft_head;
#[cfg(feature = "cuda")]
pub mod gpu_graph;
#[cfg(feature = "cuda")]
pub mod head_features;
#[cfg(feature = "cuda")]
pub mod head_graph;
pub mod llama;
#[cfg(feature = "cuda")]
pub mod llama_gpu;
pub mod mtp;
pub mod progress;
pub mod tiny_tokenizer;
pub mod tokenizer;
pub mod weights;

pub use config::{Architecture, ConfigError, ModelConfig};
pub use cpu_graph::step_io::{StepInputs, StepShape, StepStaging};
pub use eagle3::{Eagle3Config, Eagle3Error, Eagle3Head};
pub use llama::{ForwardError, LlamaBuffers, LlamaModel};
pub use weights::{WeightError, Weights};
