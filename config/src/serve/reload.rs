//! Which fields a reload changes, and the refusal when one of them needs a restart.

use super::fields::Reload;
use super::ServeConfig;
use serde_json::Value;

/// A reload the running server cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// A field fixed at start-up differs.
    #[error(
        "field {field:?} cannot change without a restart (running {old}, file says {new}); \
         the running configuration stays"
    )]
    RestartRequired {
        /// The config file's key.
        field: &'static str,
        /// The running value.
        old: String,
        /// The new value.
        new: String,
    },
}

impl ServeConfig {
    /// The reloadable fields that differ in `new`, in the file's order; refuses the reload
    /// if any field that needs a restart differs, naming the first.
    pub fn reload_changes(&self, new: &ServeConfig) -> Result<Vec<&'static str>, ReloadError> {
        let mut changed = Vec::new();
        for (old, new) in self.fields().into_iter().zip(new.fields()) {
            if old.value == new.value {
                continue;
            }
            match old.reload {
                Reload::Live => changed.push(old.name),
                Reload::Restart => {
                    return Err(ReloadError::RestartRequired {
                        field: old.name,
                        old: show(&old.value),
                        new: show(&new.value),
                    })
                }
            }
        }
        Ok(changed)
    }
}

/// A value for a message: strings bare, absence as "unset".
fn show(value: &Value) -> String {
    match value {
        Value::Null => "unset".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
