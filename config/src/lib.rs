//! Typed configuration shared by the commands: the KV cache's shape and memory budget.
//! The serving issue adds the server's fields, the TOML file and hot reload here.

mod byte_size;
mod cache;

pub use byte_size::{parse_byte_size, ByteSizeError};
pub use cache::{CacheConfig, CacheConfigError};
