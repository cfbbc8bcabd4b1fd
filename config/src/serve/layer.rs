//! Reading one source of settings: the TOML file's text into a [`Layer`] (the type itself,
//! and how layers stack, come from the table of settings: `settings.rs`).

use super::{ConfigError, Layer};
use std::path::Path;

impl Layer {
    /// Reads the TOML text of the file at `path` (named in errors).
    pub(super) fn parse(path: &Path, text: &str) -> Result<Layer, ConfigError> {
        let error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_path_buf(),
            // Syntax errors show the line; field errors end with "in `key`": keep both on
            // one line.
            message: e.to_string().trim_end().replace("\nin `", " in `"),
        };
        let table: toml::Table = text.parse().map_err(error)?;
        table.try_into().map_err(error)
    }
}
