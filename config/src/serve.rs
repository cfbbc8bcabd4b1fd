//! The server's configuration: `peregrine serve` flags over a TOML file over the defaults,
//! validated, with the rules for hot reload and a masked view for `GET /admin/config`.

mod args;
mod checks;
mod choices;
mod config;
mod error;
mod fields;
mod json;
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
pub use reload::ReloadError;
pub use sampling::SamplingDefaults;
pub use settings::ServeConfig;

use origin::Origin;
use settings::Layer;
