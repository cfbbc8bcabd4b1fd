//! The range check of each setting's given value, named by the rows of `settings.rs`.
//! A check's error says what the value must be; [`Bad::at`] names the file key or the flag.

use super::{ConfigError, KvEventsConfig, Origin, SamplingDefaults};
use crate::CacheConfig;
use std::path::Path;

/// The most draft tokens per step (the accepted-length histogram's buckets stop there).
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// A value outside its range: why, and the key below the setting it is about, if any
/// (`temperature` of `default_sampling`).
pub(super) struct Bad {
    below: Option<&'static str>,
    reason: String,
}

impl From<String> for Bad {
    fn from(reason: String) -> Bad {
        Bad {
            below: None,
            reason,
        }
    }
}

impl Bad {
    /// The error for the setting `key` of `origin`.
    pub(super) fn at(self, origin: &Origin, key: &str) -> ConfigError {
        let key = match self.below {
            Some(below) => format!("{key}.{below}"),
            None => key.to_string(),
        };
        ConfigError::Invalid {
            at: origin.name(&key),
            reason: self.reason,
        }
    }
}

type Check = Result<(), Bad>;

/// Every value of the type is fine.
pub(super) fn any<T>(_: &T) -> Check {
    Ok(())
}

/// A count of at least 1.
pub(super) fn at_least_one(value: &usize) -> Check {
    match value {
        0 => Err("must be at least 1, not 0".to_string().into()),
        _ => Ok(()),
    }
}

/// A draft count from 1 to [`MAX_SPECULATIVE_TOKENS`].
pub(super) fn speculative_tokens(k: &usize) -> Check {
    if (1..=MAX_SPECULATIVE_TOKENS).contains(k) {
        Ok(())
    } else {
        Err(format!("must be from 1 to {MAX_SPECULATIVE_TOKENS}, not {k}").into())
    }
}

/// A KV block size the cache takes.
pub(super) fn block_size(block_size: &usize) -> Check {
    let cache = CacheConfig {
        block_size: *block_size,
        kv_cache_memory: None,
    };
    cache
        .validate()
        .map_err(|_| format!("must be a power of two from 1 to 256, not {block_size}").into())
}

/// A memory budget of at least one byte.
pub(super) fn positive_bytes(bytes: &u64) -> Check {
    match bytes {
        0 => Err("must be more than 0 bytes".to_string().into()),
        _ => Ok(()),
    }
}

/// A duration of at least one second.
pub(super) fn positive_seconds(seconds: &u64) -> Check {
    match seconds {
        0 => Err("must be at least 1 second, not 0".to_string().into()),
        _ => Ok(()),
    }
}

/// Browser origins as CORS compares them: `*`, or `http://` or `https://` and a host with
/// an optional port, and nothing after it.
pub(super) fn origins(origins: &[String]) -> Check {
    for origin in origins {
        if origin == "*" {
            continue;
        }
        let host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        match host {
            Some(host) if !host.is_empty() && !host.contains(['/', '?', '#', ' ']) => {}
            _ => {
                return Err(format!(
                    "must hold origins such as https://app.example.com (a scheme and a \
                     host, no path) or *, not {origin:?}"
                )
                .into())
            }
        }
    }
    Ok(())
}

/// `Host` names: `*`, or a host name or IP address without a scheme, port or path (an
/// IPv6 address bare or in brackets).
pub(super) fn hosts(hosts: &[String]) -> Check {
    for host in hosts {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        let fine = host == "*"
            || bare.unwrap_or(host).parse::<std::net::Ipv6Addr>().is_ok()
            || (bare.is_none()
                && !host.is_empty()
                && !host.contains([':', '/', '?', '#', '@', ' ', '*']));
        if !fine {
            return Err(format!(
                "must hold host names such as api.example.com (no scheme, port or path), IP \
                 addresses or *, not {host:?}"
            )
            .into());
        }
    }
    Ok(())
}

/// A fraction in (0, 1].
pub(super) fn fraction(value: &f32) -> Check {
    if *value > 0.0 && *value <= 1.0 {
        Ok(())
    } else {
        Err(format!("must be in (0, 1], not {value}").into())
    }
}

/// A non-empty list of batch sizes of at least 1.
pub(super) fn batch_sizes(sizes: &[usize]) -> Check {
    if sizes.is_empty() || sizes.contains(&0) {
        Err(format!("must list batch sizes of at least 1, not {sizes:?}").into())
    } else {
        Ok(())
    }
}

/// A tracing filter: a bare level, or directives with `=`.
pub(super) fn log_filter(level: &str) -> Check {
    let bare = ["error", "warn", "info", "debug", "trace", "off"];
    if bare.contains(&level.to_ascii_lowercase().as_str()) || level.contains('=') {
        return Ok(());
    }
    Err(format!(
        "must be error, warn, info, debug, trace, off or a filter such as \
         \"info,peregrine=debug\", not {level:?}"
    )
    .into())
}

/// Text that is not blank.
pub(super) fn text_not_empty(text: &str) -> Check {
    match text.trim() {
        "" => Err("must not be empty".to_string().into()),
        _ => Ok(()),
    }
}

/// A path that is not blank (a path that is not UTF-8 is not checked).
pub(super) fn path_not_empty(path: &Path) -> Check {
    path.to_str().map_or(Ok(()), text_not_empty)
}

/// Keys none of which is blank.
pub(super) fn keys_not_empty(keys: &[String]) -> Check {
    match keys.iter().position(|k| k.trim().is_empty()) {
        Some(i) => Err(format!("must not hold an empty key (key {})", i + 1).into()),
        None => Ok(()),
    }
}

/// Sampling defaults within vLLM's ranges.
pub(super) fn sampling(defaults: &SamplingDefaults) -> Check {
    defaults.validate().map_err(|(below, reason)| Bad {
        below: Some(below),
        reason,
    })
}

/// A KV events configuration whose endpoints and sizes Peregrine serves.
pub(super) fn kv_events(config: &KvEventsConfig) -> Check {
    config.validate().map_err(|(below, reason)| Bad {
        below: Some(below),
        reason,
    })
}
