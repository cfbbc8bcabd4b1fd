//! The `peregrine serve` flags: `--config`, and one flag per setting (the table of settings,
//! `settings.rs`, declares them). None has a clap default, so that a flag left out does not
//! override the file; the defaults live in the table.

use super::Layer;
use std::path::PathBuf;

/// `peregrine serve` flags; each one given overrides the config file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// A TOML file with the same settings (names with underscores); flags override it.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// The settings the flags give.
    #[command(flatten)]
    pub(super) layer: Layer,
}
