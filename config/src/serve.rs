//! The server's configuration: `peregrine serve` flags over a TOML file over the defaults,
//! validated, with the rules for hot reload and a masked view for `GET /admin/config`.

mod args;
mod checks;
mod choices;
mod config;
mod error;
mod fields;
mod json;
mod kv_events;
mod layer;
mod mask;
mod origin;
mod reload;
mod sampling;
mod settings;
mod table;
mod validate;

#[cfg(test)]
mod tests;

pub use args::ServeArgs;
pub use checks::MAX_SPECULATIVE_TOKENS;
pub use choices::{DeviceKind, DtypeChoice, SpeculativeMethod, ToolCallParser};
pub use error::ConfigError;
pub use kv_events::{KvEventsConfig, KvEventsEncoding, KvEventsPublisher, KV_EVENTS_HWM};
pub use reload::ReloadError;
pub use sampling::SamplingDefaults;
pub use settings::ServeConfig;

use origin::Origin;
use settings::Layer;
