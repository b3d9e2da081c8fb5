//! What every subsystem's settings are made of: durations as people write
//! them, addresses that may be "off", and the error of a value that does
//! not fit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A duration written the human way: `250ms`, `1s`, `5m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = humantime::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(HumanDuration)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Why the configuration is unusable.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML file did not parse.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        source: Box<toml::de::Error>,
    },
    /// The TOML file names a key that is no setting.
    #[error("{path}: unknown setting `{key}`")]
    Unknown {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// A key of the TOML file has a value its setting does not take.
    #[error("{path}: {key}: {why}")]
    Value {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong with the value.
        why: String,
    },
    /// An engine subscription does not parse.
    #[error("engine = {value}: {why}")]
    Engine {
        /// The text.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// A value is out of range.
    #[error("{name} = {value}: {why}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
}

/// The error of setting `name` at `value`, which breaks `why`.
pub(crate) fn invalid<T>(
    name: &'static str,
    value: &dyn ToString,
    why: &'static str,
) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        name,
        value: value.to_string(),
        why,
    })
}

/// A duration setting, or its default.
pub(crate) fn duration(set: Option<HumanDuration>, default: Duration) -> Duration {
    set.map_or(default, |h| h.0)
}

/// A duration setting where `0s` means off, or its default.
pub(crate) fn duration_or_off(
    set: Option<HumanDuration>,
    default: Option<Duration>,
) -> Option<Duration> {
    match set {
        None => default,
        Some(h) if h.0.is_zero() => None,
        Some(h) => Some(h.0),
    }
}

/// How a duration that may be off is written back: `0s` for off.
pub(crate) fn written_or_off(d: Option<Duration>) -> Option<HumanDuration> {
    Some(HumanDuration(d.unwrap_or(Duration::ZERO)))
}

/// An address setting where "off" means none, or its default.
pub(crate) fn address_or_off(
    name: &'static str,
    set: Option<&str>,
    default: Option<SocketAddr>,
) -> Result<Option<SocketAddr>, ConfigError> {
    match set {
        None => Ok(default),
        Some("off") => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .or_else(|_| invalid(name, &s, "not an address (host:port) or \"off\"")),
    }
}

/// How an address that may be off is written back.
pub(crate) fn address_written(a: Option<SocketAddr>) -> Option<String> {
    Some(a.map_or("off".into(), |a| a.to_string()))
}
