//! What every subsystem's settings are made of: durations as people write
//! them, addresses that may be "off", and the error of a value that does
//! not fit.

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
    /// An item of a list setting (an engine, a peer, an identity) does
    /// not parse.
    #[error("{name} = {value}: {why}")]
    Item {
        /// The setting.
        name: String,
        /// The item.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// A value is out of range.
    #[error("{name} = {value}: {why}")]
    Invalid {
        /// The setting (its TOML key, or several, with '/').
        name: String,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: String,
    },
}

/// The error of setting `name` at `value`, which breaks `why`. `name` is
/// its TOML key, or its field's name (snake_case), which is written as the
/// key.
pub(crate) fn invalid<T>(
    name: &'static str,
    value: &dyn ToString,
    why: impl Into<String>,
) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        name: name.replace('_', "-"),
        value: value.to_string(),
        why: why.into(),
    })
}
