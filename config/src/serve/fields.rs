//! A configuration's fields as reload and the masked view read them (listed by
//! `ServeConfig::fields`, which the table of settings writes): each one's key, whether it
//! can change while the server runs, whether it is a secret, and its value.

use serde_json::Value;

/// Whether a field can change without a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reload {
    /// Applied to the running server by message.
    Live,
    /// Fixed at start-up (the model, the memory layout, the listening socket).
    Restart,
}

/// One field of a configuration.
pub(super) struct Field {
    /// The config file's key.
    pub name: &'static str,
    /// Whether it reloads.
    pub reload: Reload,
    /// Whether the masked view hides it.
    pub secret: bool,
    /// Its value.
    pub value: Value,
}
