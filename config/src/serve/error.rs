//! Why a configuration refuses to load.

use std::path::PathBuf;

/// A configuration that cannot be used; the message names the file or flag and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file named by `--config` cannot be read.
    #[error("cannot read the config file {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not TOML, has a key the server does not know, or a value of the wrong type.
    #[error("{}: {message}", .path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the key.
        message: String,
    },
    /// A value of the right type outside its allowed range.
    #[error("{at} {reason}")]
    Invalid {
        /// Where the value came from: `FILE: field` or `--flag`.
        at: String,
        /// What the value must be, and what it is.
        reason: String,
    },
}
