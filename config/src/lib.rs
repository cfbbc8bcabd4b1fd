//! Typed configuration shared by the commands: the KV cache's shape and memory budget, and
//! the server's configuration (flags, TOML file, validation, which fields hot-reload).

mod byte_size;
mod cache;
mod serve;

pub use byte_size::{parse_byte_size, ByteSizeError};
pub use cache::{CacheConfig, CacheConfigError};
pub use serve::{
    ConfigError, DeviceKind, DtypeChoice, KvEventsConfig, KvEventsEncoding, KvEventsPublisher,
    ReloadError, SamplingDefaults, ServeArgs, ServeConfig, SpeculativeMethod, ToolCallParser,
    KV_EVENTS_HWM, MAX_SPECULATIVE_TOKENS,
};
