//! The server's configuration: `peregrine serve` flags over a TOML file over the defaults,
//! validated, with the rules for hot reload and a masked view for `GET /admin/config`.

mod args;
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
mod validate;

#[cfg(test)]
mod tests;

pub use args::ServeArgs;
pub use choices::{DeviceKind, DtypeChoice, SpeculativeMethod};
pub use config::ServeConfig;
pub use error::ConfigError;
pub use reload::ReloadError;
pub use sampling::SamplingDefaults;

use layer::Layer;
use origin::Origin;
