//! GGUF import: read a llama.cpp GGUF file, convert it to a Hugging Face model folder
//! (`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`) or import
//! it as a folder whose weights stay in the GGUF file, and read those weights as stored.

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
mod weights;

pub use convert::{convert_gguf, import_gguf, Placement};
pub use dequant::dequantize;
pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::Value;
pub use weights::GgufWeights;

/// The name of the GGUF file inside a folder made by [`import_gguf`].
pub const GGUF_WEIGHTS: &str = "model.gguf";
