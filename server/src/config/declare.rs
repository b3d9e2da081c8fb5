//! How a subsystem declares its settings: once each, in a [`settings!`]
//! table that makes the settings struct (flags and TOML keys through clap
//! and serde, every field optional; the environment variables follow from
//! the names, `Settings::augment`), both ways
//! between it and the resolved [`super::ServerConfig`], each value's
//! check and, where the subsystem's configuration is this crate's, that
//! struct and its `Default`.
//!
//! A setting's written form (what a user types) and its resolved value
//! differ for some: its *kind* is the module that maps one to the other,
//! with `put(name, written, &mut value)` and `written(&value)`. The kinds
//! every subsystem uses are here; a subsystem keeps its own beside its
//! table. So are the [`Rule`]s a value is checked by.

use std::ops::{RangeFrom, RangeInclusive};
use std::time::Duration;

use super::value::{invalid, ConfigError};

/// Declares a subsystem's settings. First the settings struct (its doc
/// comment, its name and its place in `ServerConfig`), then one entry per
/// setting: its `--help` text (the doc comment), its flag (`#[arg]`; the
/// environment variable follows from the name, see `Settings::augment`),
/// its written form and kind, its field in the
/// subsystem's configuration with, where this table makes that struct,
/// the field's type and default (the reason for it in a comment above),
/// and the [`Rule`] its value keeps:
///
/// ```text
/// /// Heavy requests one connection may have running at once.
/// #[arg(long)]
/// // Enough to keep both blocking-pool cores busy from one client.
/// max_in_flight: usize = plain => max_in_flight: usize = 16, check 1..=65_536,
/// ```
///
/// The setting's TOML key is its name in kebab-case. A field may be one
/// level down (`dns.interval`); two settings may set one field (the first
/// gives its type). When the table ends with the configuration struct
/// (its doc comment, name and the fields no single setting sets, which
/// take their types' defaults), it makes that struct too.
macro_rules! settings {
    (@config $settings:ident $fields:tt) => {}; // another crate's configuration
    (
        @config $settings:ident { $($name:ident $field:ident $(: $ty:ty = $default:expr)?,)* }
        $(#[doc = $doc:literal])*
        pub struct $config:ident { $($(#[doc = $other_doc:literal])* $other:ident: $other_ty:ty,)* }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $config {
            $($(
                #[doc = concat!("See [`", stringify!($settings), "::", stringify!($name), "`].")]
                pub $field: $ty,
            )?)*
            $($(#[doc = $other_doc])* pub $other: $other_ty,)*
        }

        impl Default for $config {
            fn default() -> Self {
                $config {
                    $($($field: $default,)?)*
                    $($other: Default::default(),)*
                }
            }
        }
    };
    (
        $(#[doc = $doc:literal])*
        pub struct $settings:ident => $group:ident {
            $(
                $(#[doc = $help:literal])*
                #[arg($($arg:tt)*)]
                $name:ident: $form:ty = $kind:ident => $field:ident $(.$sub:ident)?
                    $(: $ty:ty = $default:expr)? $(, check $check:expr)?,
            )*
        }
        $($config:tt)*
    ) => {
        $(#[doc = $doc])*
        #[derive(
            Debug, Clone, Default, PartialEq, clap::Args, serde::Deserialize, serde::Serialize,
        )]
        #[serde(rename_all = "kebab-case")]
        // The help texts write a value to fill in as `<name>`, as `--help`
        // shows it, not as HTML.
        #[allow(rustdoc::invalid_html_tags)]
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
                        let value = &mut cfg.$group.$field $(.$sub)?;
                        $kind::put(stringify!($name), written, value)?;
                    }
                )*
                Ok(())
            }

            /// The settings that give `cfg`'s values.
            pub fn of(cfg: &$crate::config::ServerConfig) -> Self {
                $settings {
                    $($name: $kind::written(&cfg.$group.$field $(.$sub)?),)*
                }
            }

            /// Checks each value in `cfg` by its setting's rule.
            pub(crate) fn check(
                cfg: &$crate::config::ServerConfig,
            ) -> Result<(), $crate::config::ConfigError> {
                $(
                    #[allow(unused_variables)] // by settings without a rule
                    let value = &cfg.$group.$field $(.$sub)?;
                    $($crate::config::declare::Rule::check(&$check, stringify!($name), value)?;)?
                )*
                Ok(())
            }
        }

        $crate::config::declare::settings! {
            @config $settings { $($name $field $(: $ty = $default)?,)* } $($config)*
        }
    };
}

pub(crate) use settings;

/// What a setting's value must be.
pub(crate) trait Rule<T> {
    /// `Ok` if `value` keeps the rule, else the error of setting `name` at it.
    fn check(&self, name: &'static str, value: &T) -> Result<(), ConfigError>;
}

/// How a range's bounds and a refused value are written in errors.
pub(crate) trait Bound: PartialOrd + Default {
    fn bound(&self) -> String;
    fn value(&self) -> String {
        self.bound()
    }
}

impl Bound for Duration {
    fn bound(&self) -> String {
        humantime::format_duration(*self).to_string()
    }
    fn value(&self) -> String {
        format!("{self:?}")
    }
}

macro_rules! integer_bound {
    ($($t:ty),*) => {$(
        impl Bound for $t {
            fn bound(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
integer_bound!(u32, u64, usize);

impl<T: Bound> Rule<T> for RangeInclusive<T> {
    fn check(&self, name: &'static str, value: &T) -> Result<(), ConfigError> {
        if self.contains(value) {
            return Ok(());
        }
        let why = format!("must be {} to {}", self.start().bound(), self.end().bound());
        invalid(name, &value.value(), why)
    }
}

impl<T: Bound> Rule<T> for RangeFrom<T> {
    fn check(&self, name: &'static str, value: &T) -> Result<(), ConfigError> {
        if self.contains(value) {
            return Ok(());
        }
        let why = format!("must be at least {}", self.start.bound());
        invalid(name, &value.value(), why)
    }
}

/// Not zero, else the error of setting `.0` at `.1`, which breaks `.2`:
/// settings refused together (as `max-connections/max-streams = 0`) share
/// one.
pub(crate) struct NotZero(pub &'static str, pub &'static str, pub &'static str);

impl<T: Bound> Rule<T> for NotZero {
    fn check(&self, _: &'static str, value: &T) -> Result<(), ConfigError> {
        if *value != T::default() {
            return Ok(());
        }
        invalid(self.0, &self.1, self.2)
    }
}

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
        let item = |s: String| {
            s.parse().map_err(|e: T::Err| ConfigError::Item {
                name: name.replace('_', "-"),
                value: s,
                why: e.to_string(),
            })
        };
        *value = written.into_iter().map(item).collect::<Result<_, _>>()?;
        Ok(())
    }

    pub fn written<T: Display>(value: &[T]) -> Option<Vec<String>> {
        (!value.is_empty()).then(|| value.iter().map(ToString::to_string).collect())
    }
}
