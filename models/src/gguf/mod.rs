//! GGUF import: read a llama.cpp GGUF file and convert it to a Hugging Face model folder
//! (`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`).

mod convert;
mod cursor;
mod dequant;
mod hf_config;
mod metadata;
mod names;
mod permute;
mod reader;
mod special_tokens;
mod tokenizer;
mod types;
mod value;

pub use convert::convert_gguf;
pub use dequant::dequantize;
pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::Value;
