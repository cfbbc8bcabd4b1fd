//! Model architectures (the Llama and DeepSeek families, EAGLE-3 and MTP draft heads), Hugging Face config parsing, safetensors loading, GGUF import,
//! tokenizers and chat templates.

pub mod chat_template;
pub mod config;
pub mod draft_head;
pub mod eagle3;
pub mod fetch;
pub mod gguf;
pub mod graph;
pub mod llama;
pub mod mtp;
pub mod progress;
pub mod tensor_parallel;
pub mod tiny_tokenizer;
pub mod tokenizer;
pub mod weights;

pub use config::{Architecture, ConfigError, ModelConfig};
pub use eagle3::{Eagle3Config, Eagle3Error, Eagle3Head};
pub use graph::cpu::step_io::{StepInputs, StepShape, StepStaging};
pub use llama::{ForwardError, LlamaBuffers, LlamaModel};
pub use weights::{WeightError, Weights};
