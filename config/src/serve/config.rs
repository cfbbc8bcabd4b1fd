//! Resolving the server configuration: the file, the flags over it, the defaults under
//! both (the type itself comes from the table of settings: `settings.rs`).

use super::{ConfigError, Layer, Origin, ServeArgs, ServeConfig};
use crate::CacheConfig;
use std::path::Path;

impl ServeConfig {
    /// Reads the file `--config` names (if any), applies the flags over it, fills the
    /// defaults and validates. Call it again to reload: the flags still win.
    pub fn load(args: &ServeArgs) -> Result<ServeConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Some((path.as_path(), text))
            }
            None => None,
        };
        Self::resolve(
            file.as_ref().map(|(path, text)| (*path, text.as_str())),
            args,
        )
    }

    /// `load` once the file's text is read: `file` is its path and text.
    pub(super) fn resolve(
        file: Option<(&Path, &str)>,
        args: &ServeArgs,
    ) -> Result<ServeConfig, ConfigError> {
        let below = match file {
            Some((path, text)) => {
                let layer = Layer::parse(path, text)?;
                layer.validate(&Origin::File(path.to_path_buf()))?;
                layer
            }
            None => Layer::default(),
        };
        let flags = args.layer.clone();
        flags.validate(&Origin::Flags)?;
        let config = Self::fill(flags.over(below));
        config.validate_speculation(file.map(|(path, _)| path))?;
        config.validate_graph_sizes(file.map(|(path, _)| path))?;
        config.validate_dtype(file.map(|(path, _)| path))?;
        config.validate_step_limits(file.map(|(path, _)| path))?;
        Ok(config)
    }

    /// Draft tokens verified per sequence and step: `num_speculative_tokens` with
    /// speculative decoding on, else 0.
    pub fn drafts_per_step(&self) -> usize {
        match self.speculative_method {
            Some(_) => self.num_speculative_tokens,
            None => 0,
        }
    }

    /// The KV cache's shape and budget, for the KV allocator.
    pub fn cache_config(&self) -> CacheConfig {
        CacheConfig {
            block_size: self.block_size,
            kv_cache_memory: self.kv_cache_memory,
        }
    }
}
