//! Where a value came from, so that an error points at the file or at the flag.

use super::settings::flag_of;
use std::path::PathBuf;

/// The source of one layer of settings.
#[derive(Clone, Debug)]
pub(super) enum Origin {
    /// The TOML file at this path.
    File(PathBuf),
    /// The command line.
    Flags,
}

impl Origin {
    /// How to name `field` (a file key) of this source: `config.toml: max_num_seqs` or
    /// `--max-num-seqs`.
    pub(super) fn name(&self, field: &str) -> String {
        match self {
            Origin::File(path) => format!("{}: {field}", path.display()),
            Origin::Flags => flag_of(field)
                .map_or_else(|| format!("--{}", field.replace('_', "-")), str::to_string),
        }
    }
}
