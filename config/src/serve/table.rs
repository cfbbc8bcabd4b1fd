//! How the one table of settings (`settings.rs`) becomes the types that read and hold them.
//! Each row of the table names a setting once: its key (the TOML key and the field name),
//! its type and default, the type the file and the flag give, how that fills the setting,
//! whether it reloads live, whether it is a secret, its check, and its flag. From the rows
//! [`settings!`] writes:
//!
//! - `Layer`: what one source (the TOML file, the flags) gives, every setting optional; it
//!   is both the file's serde format and, flattened into `ServeArgs`, the flags' clap
//!   format; with `over` (stacking two sources) and `validate` (each row's check);
//! - `ServeConfig`: the resolved configuration, with `Default` and `fill` (a layer over
//!   the defaults);
//! - `ServeConfig::fields`, the table reload and the masked view read;
//! - `flag_of`, the flag that sets a setting, for error messages.

/// Writes the configuration types from the table of settings; see the module doc.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty = $default:expr;
            given $given:ty, fill $fill:ident, reload $reload:ident, $secrecy:ident,
            check $check:path, flag $flag:literal, arg($($arg:tt)*)
            $(, serde($($serde:tt)*))?;
    )*) => {
        /// The settings one source gives (the TOML file, or the flags once read), every one
        /// optional; keys are the flag names with underscores. Layers stack (flags over
        /// the file) before the defaults fill the gaps.
        #[derive(clap::Args, serde::Deserialize, Clone, Debug, Default, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub(super) struct Layer {
            $(
                #[arg($($arg)*)]
                $(#[serde($($serde)*)])?
                pub $name: Option<$given>,
            )*
        }

        impl Layer {
            /// This layer with the gaps filled from `below`.
            pub(super) fn over(self, below: Layer) -> Layer {
                Layer {
                    $($name: self.$name.or(below.$name),)*
                }
            }

            /// Checks every value this layer sets; types were checked when it was read.
            pub(super) fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
                $(
                    if let Some(value) = &self.$name {
                        $check(value).map_err(|bad| bad.at(origin, stringify!($name)))?;
                    }
                )*
                Ok(())
            }
        }

        /// The server's validated configuration; field names are the config file's keys.
        #[derive(Clone, PartialEq)]
        pub struct ServeConfig {
            $(
                $(#[doc = $doc])*
                pub $name: $ty,
            )*
        }

        impl Default for ServeConfig {
            /// The defaults: the one place they are written.
            fn default() -> Self {
                ServeConfig {
                    $($name: $default,)*
                }
            }
        }

        impl ServeConfig {
            /// The layer's values, and the defaults where it has none.
            pub(super) fn fill(layer: Layer) -> ServeConfig {
                let defaults = ServeConfig::default();
                ServeConfig {
                    $($name: $crate::serve::table::fill::$fill(layer.$name, defaults.$name),)*
                }
            }

            /// Every field with its key, whether it reloads, whether it is a secret, and
            /// its value, in the table's order.
            pub(super) fn fields(&self) -> Vec<Field> {
                vec![
                    $(Field {
                        name: stringify!($name),
                        reload: Reload::$reload,
                        secret: Secrecy::$secrecy == Secrecy::Secret,
                        value: self.$name.to_json(),
                    },)*
                ]
            }
        }

        /// The flag that sets the setting `key`, if it is one.
        pub(super) fn flag_of(key: &str) -> Option<&'static str> {
            match key {
                $(stringify!($name) => Some($flag),)*
                _ => None,
            }
        }
    };
}

pub(super) use settings;

/// How a setting's given value fills it: `value` takes it or the default, `optional` the
/// same for a setting that may stay unset, `seconds` reads a number of seconds.
pub(super) mod fill {
    use std::time::Duration;

    /// The given value, else the default.
    pub fn value<T>(given: Option<T>, default: T) -> T {
        given.unwrap_or(default)
    }

    /// The given value, else the default (which may be unset too).
    pub fn optional<T>(given: Option<T>, default: Option<T>) -> Option<T> {
        given.or(default)
    }

    /// The given seconds, else the default.
    pub fn seconds(given: Option<u64>, default: Duration) -> Duration {
        given.map_or(default, Duration::from_secs)
    }
}

/// Whether the masked view hides a setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Secrecy {
    Public,
    Secret,
}
