//! How a subsystem declares its settings: once each, in a [`settings!`]
//! table that makes the settings struct (flags, environment variables and
//! TOML keys through clap and serde, every field optional) and both ways
//! between it and the resolved [`super::ServerConfig`]: a set setting is
//! put in its place there, and a configuration is written back as the
//! settings that give it.
//!
//! A setting's written form (what a user types) and its resolved value
//! differ for some: its *kind* is the module that maps one to the other,
//! with `put(name, written, &mut value)` and `written(&value)`. The kinds
//! every subsystem uses are here; a subsystem keeps its own beside its
//! table.

/// Declares a subsystem's settings: the struct (its doc comment and name,
/// then one entry per setting) and, per setting, its `--help` text (the
/// doc comment), its flag and environment variable (`#[arg]`), its written
/// form, its kind and the place of its value in `ServerConfig`:
///
/// ```text
/// /// Most ops in one batch.
/// #[arg(long, env = "PREFIX_INDEX_MAX_BATCH")]
/// max_batch: usize = plain => limits.max_batch,
/// ```
///
/// The setting's TOML key is its name in kebab-case. Its default, with the
/// reason for it, is the resolved configuration's `Default`.
macro_rules! settings {
    (
        $(#[doc = $doc:literal])*
        pub struct $settings:ident {
            $(
                $(#[doc = $help:literal])*
                #[arg($($arg:tt)*)]
                $name:ident: $form:ty = $kind:ident => $($place:ident).+,
            )*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(
            Debug, Clone, Default, PartialEq, clap::Args, serde::Deserialize, serde::Serialize,
        )]
        #[serde(rename_all = "kebab-case")]
        pub struct $settings {
            $(
                $(#[doc = $help])*
                #[arg($($arg)*)]
                pub $name: Option<$form>,
            )*
        }

        impl $settings {
            /// Puts each setting that is set in its place in `cfg`.
            pub fn put(
                self,
                cfg: &mut $crate::config::ServerConfig,
            ) -> Result<(), $crate::config::ConfigError> {
                $(
                    if let Some(written) = self.$name {
                        $kind::put(stringify!($name), written, &mut cfg.$($place).+)?;
                    }
                )*
                Ok(())
            }

            /// The settings that give `cfg`'s values.
            pub fn of(cfg: &$crate::config::ServerConfig) -> Self {
                $settings {
                    $($name: $kind::written(&cfg.$($place).+),)*
                }
            }
        }
    };
}

pub(crate) use settings;

/// A value written as it is held.
pub(crate) mod plain {
    use crate::config::ConfigError;

    pub fn put<T>(_: &'static str, written: T, value: &mut T) -> Result<(), ConfigError> {
        *value = written;
        Ok(())
    }

    pub fn written<T: Clone>(value: &T) -> Option<T> {
        Some(value.clone())
    }
}

/// A value that may be absent, as it is held when set (absent by default
/// and then left unset).
pub(crate) mod optional {
    use crate::config::ConfigError;

    pub fn put<T>(_: &'static str, written: T, value: &mut Option<T>) -> Result<(), ConfigError> {
        *value = Some(written);
        Ok(())
    }

    pub fn written<T: Clone>(value: &Option<T>) -> Option<T> {
        value.clone()
    }
}

/// A duration written the human way (`250ms`, `5m`).
pub(crate) mod duration {
    use std::time::Duration;

    use crate::config::{ConfigError, HumanDuration};

    pub fn put(
        _: &'static str,
        written: HumanDuration,
        value: &mut Duration,
    ) -> Result<(), ConfigError> {
        *value = written.0;
        Ok(())
    }

    pub fn written(value: &Duration) -> Option<HumanDuration> {
        Some(HumanDuration(*value))
    }
}

/// A duration where `0s` means off.
pub(crate) mod duration_or_off {
    use std::time::Duration;

    use crate::config::{ConfigError, HumanDuration};

    pub fn put(
        _: &'static str,
        written: HumanDuration,
        value: &mut Option<Duration>,
    ) -> Result<(), ConfigError> {
        *value = (!written.0.is_zero()).then_some(written.0);
        Ok(())
    }

    pub fn written(value: &Option<Duration>) -> Option<HumanDuration> {
        Some(HumanDuration(value.unwrap_or(Duration::ZERO)))
    }
}

/// A duration written in whole seconds.
pub(crate) mod seconds {
    use std::time::Duration;

    use crate::config::ConfigError;

    pub fn put(_: &'static str, written: u64, value: &mut Duration) -> Result<(), ConfigError> {
        *value = Duration::from_secs(written);
        Ok(())
    }

    pub fn written(value: &Duration) -> Option<u64> {
        Some(value.as_secs())
    }
}

/// An address, or `off` for none.
pub(crate) mod address_or_off {
    use std::net::SocketAddr;

    use crate::config::value::invalid;
    use crate::config::ConfigError;

    pub fn put(
        name: &'static str,
        written: String,
        value: &mut Option<SocketAddr>,
    ) -> Result<(), ConfigError> {
        *value = match written.as_str() {
            "off" => None,
            s => Some(
                s.parse()
                    .or_else(|_| invalid(name, &s, "not an address (host:port) or \"off\""))?,
            ),
        };
        Ok(())
    }

    pub fn written(value: &Option<SocketAddr>) -> Option<String> {
        Some(value.map_or("off".into(), |a| a.to_string()))
    }
}

/// A list, each item in its text form; an empty list is left unset.
pub(crate) mod list {
    use std::fmt::Display;
    use std::str::FromStr;

    use crate::config::ConfigError;

    pub fn put<T>(
        name: &'static str,
        written: Vec<String>,
        value: &mut Vec<T>,
    ) -> Result<(), ConfigError>
    where
        T: FromStr,
        T::Err: Display,
    {
        *value = written
            .into_iter()
            .map(|s| {
                s.parse().map_err(|e: T::Err| ConfigError::Item {
                    name: name.replace('_', "-"),
                    value: s,
                    why: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    pub fn written<T: Display>(value: &[T]) -> Option<Vec<String>> {
        (!value.is_empty()).then(|| value.iter().map(ToString::to_string).collect())
    }
}
