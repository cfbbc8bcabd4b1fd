//! Model operators on the CUDA backend (the `cuda` feature).

pub mod attention;
mod attention_error;
pub mod kv_cache;
pub mod mla;
pub mod plan;
pub mod sampler;

pub use kv_cache::GpuKvCache;
