//! Server configuration: flags, `PREFIX_INDEX_*` environment variables and an
//! optional TOML file, in that order of precedence, over documented defaults.
//!
//! [`Settings`] is what a user may set (every field optional, the same names
//! as flags and TOML keys); [`ServerConfig`] is the resolved configuration the
//! server runs with. Every limit the server enforces is a field here.
//!
//! Each subsystem declares its settings once, in its `settings!` (`declare.rs`)
//! table: per setting its help, flag, written form, field, default with the
//! reason for it, and rule (its environment variable follows from its name,
//! [`Settings::augment`]). The transport, the request limits and the index
//! are in this module's files; precise mode's in `engines/config.rs`, the
//! replicas' in `replica/config.rs`, the roles' in `access.rs`. This file
//! composes them (`subsystems!`) and checks what spans two.

use std::path::{Path, PathBuf};

use prefix_index::IndexConfig;
use prefix_proto::Limits;
use serde::{Deserialize, Serialize};

pub use crate::access::{Identity, RoleSettings, Roles};
pub use crate::engines::{EngineConfig, EngineSettings};
pub use crate::replica::config::{ReplicaConfig, ReplicaSettings};

pub(crate) mod declare;
mod index;
mod limits;
mod transport;
pub(crate) mod value;

pub use index::{IndexSettings, Upkeep, UpkeepSettings};
pub use limits::{LimitSettings, LimitsConfig};
pub use transport::{CertSource, TransportConfig, TransportSettings};
pub use value::{ConfigError, HumanDuration};

/// Declares [`Settings`] and [`ServerConfig`] from one list of the
/// subsystems (each one's field, settings struct and configuration struct,
/// with one doc comment for both fields), and what goes through all of
/// them: resolving, describing and checking.
macro_rules! subsystems {
    ($($(#[doc = $doc:literal])* $name:ident: $settings:ident => $config:ident,)*) => {
        /// What a user may set. Flags override the environment, which
        /// overrides the TOML file (`--config`), which overrides the
        /// defaults of [`ServerConfig`].
        ///
        /// Each field is one setting: its name is the TOML key (in
        /// kebab-case) and, upper-cased behind `PREFIX_INDEX_`, the
        /// environment variable; the flag is the same name (singular for the
        /// repeatable `--reader`, `--writer`, `--peer` and `--engine`); its
        /// doc comment is the `--help` text. [`Settings::augment`] gives
        /// each flag its variable and shows its default.
        #[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize, Serialize)]
        #[serde(rename_all = "kebab-case")]
        pub struct Settings {
            /// Directory for the generated certificate and the index snapshot.
            #[arg(long)]
            pub data_dir: Option<PathBuf>,
            $(
                $(#[doc = $doc])*
                #[command(flatten)]
                #[serde(flatten)]
                pub $name: $settings,
            )*
        }

        /// The resolved configuration of a server.
        #[derive(Debug, Clone, PartialEq)]
        pub struct ServerConfig {
            /// Data directory: the generated certificate, the snapshot, the
            /// QUIC endpoint's key. Default `./prefix-index-data`.
            pub data_dir: PathBuf,
            $($(#[doc = $doc])* pub $name: $config,)*
        }

        impl Default for ServerConfig {
            fn default() -> Self {
                ServerConfig {
                    data_dir: PathBuf::from("prefix-index-data"),
                    $($name: $config::default(),)*
                }
            }
        }

        impl Settings {
            /// Puts each setting that is set in its place in `cfg`.
            fn put(self, cfg: &mut ServerConfig) -> Result<(), ConfigError> {
                if let Some(dir) = self.data_dir {
                    cfg.data_dir = dir;
                }
                $(self.$name.put(cfg)?;)*
                Ok(())
            }
        }

        /// The settings that resolve to `cfg`: every value set, `off`/`0s`
        /// for what is off. `Settings::from(&cfg).resolve()` gives `cfg`
        /// back (a test holds this for every field).
        impl From<&ServerConfig> for Settings {
            fn from(cfg: &ServerConfig) -> Self {
                Settings {
                    data_dir: Some(cfg.data_dir.clone()),
                    $($name: $settings::of(cfg),)*
                }
            }
        }

        impl ServerConfig {
            /// Checks each value by its setting's rule.
            fn check_each(&self) -> Result<(), ConfigError> {
                $($settings::check(self)?;)*
                Ok(())
            }
        }
    };
}

subsystems! {
    /// The listeners, TLS, connections and shutdown.
    transport: TransportSettings => TransportConfig,
    /// The limits of one request.
    limits: LimitSettings => LimitsConfig,
    /// The index's own bounds and policies (see [`IndexConfig`]).
    index: IndexSettings => IndexConfig,
    /// The sweep and snapshots.
    upkeep: UpkeepSettings => Upkeep,
    /// Roles of client identities (see [`crate::Access`]). Default: none,
    /// every connected client may write.
    roles: RoleSettings => Roles,
    /// The other replicas, and how a cold start fills itself from them (see
    /// `bootstrap.rs`). Default: no peers.
    replicas: ReplicaSettings => ReplicaConfig,
    /// Precise mode: engine subscriptions and their limits (see
    /// `engines/`). Default: no engines.
    engines: EngineSettings => EngineConfig,
}

impl Settings {
    /// Reads a TOML settings file.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Settings::from_toml(&text, path)
    }

    /// Parses TOML settings (`path` names them in errors). A key that is
    /// no setting is refused, as a misspelt one would otherwise be
    /// ignored.
    pub fn from_toml(text: &str, path: &Path) -> Result<Settings, ConfigError> {
        let parse = |source| ConfigError::Parse {
            path: path.into(),
            source: Box::new(source),
        };
        let table: toml::Table = toml::from_str(text).map_err(parse)?;
        let names = Settings::names();
        if let Some(key) = table.keys().find(|k| !names.contains(k)) {
            return Err(ConfigError::Unknown {
                path: path.into(),
                key: key.clone(),
            });
        }
        // Through the flattened groups a bad value's error no longer names
        // its key: each key alone finds the first one that is refused.
        toml::Value::Table(table.clone()).try_into().map_err(|e| {
            table
                .into_iter()
                .find_map(|(key, value)| {
                    let one = toml::Value::Table(toml::Table::from_iter([(key.clone(), value)]));
                    one.try_into::<Settings>()
                        .err()
                        .map(|e| ConfigError::Value {
                            path: path.into(),
                            key,
                            why: e.message().to_string(),
                        })
                })
                .unwrap_or_else(|| parse(e))
        })
    }

    /// These settings, with `under`'s filling the gaps.
    pub fn or(self, under: Settings) -> Settings {
        let (mut merged, over) = (under.to_table(), self.to_table());
        merged.extend(over);
        // Both tables come from `Settings` values, so they deserialize back
        // into one; should that ever fail, the upper settings alone stand.
        toml::Value::Table(merged).try_into().unwrap_or(self)
    }

    /// The settings that are set, as a TOML table (unset ones are absent).
    fn to_table(&self) -> toml::Table {
        // Every field serializes to a TOML value (strings, integers, arrays
        // of strings); `None` fields are left out.
        toml::Table::try_from(self).unwrap_or_default()
    }

    /// Every setting's value in `cfg`, rendered as a user would write it:
    /// `none` for an unset optional one.
    pub fn describe(cfg: &ServerConfig) -> Vec<(String, String)> {
        let table = Settings::from(cfg).to_table();
        Settings::names()
            .into_iter()
            .map(|name| {
                let value = match table.get(&name) {
                    Some(toml::Value::String(s)) => s.clone(),
                    Some(toml::Value::Array(a)) => a
                        .iter()
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                        .collect::<Vec<_>>()
                        .join(";"),
                    Some(v) => v.to_string(),
                    None => "none".into(),
                };
                (name, value)
            })
            .collect()
    }

    /// Every setting's TOML key, in declaration order.
    pub fn names() -> Vec<String> {
        use clap::Args as _;
        let cmd = Settings::augment_args(clap::Command::new("settings"));
        cmd.get_arguments()
            .map(|a| a.get_id().as_str().replace('_', "-"))
            .collect()
    }

    /// `cmd` (which flattens [`Settings`]) with what each setting's
    /// declaration leaves to one rule: its environment variable, its name
    /// upper-cased behind `PREFIX_INDEX_` (read here: clap takes a
    /// variable's value when it is named), and its default from
    /// [`ServerConfig::default`] shown in its help, as `[default: ...]`.
    /// The defaults are not clap's: a flag's absence must leave room for
    /// the environment and the file.
    pub fn augment(mut cmd: clap::Command) -> clap::Command {
        for (name, value) in Settings::describe(&ServerConfig::default()) {
            let id = name.replace('-', "_");
            let env = format!("PREFIX_INDEX_{}", id.to_uppercase());
            cmd = cmd.mut_arg(id, |arg| {
                let arg = arg.env(env);
                if value == "none" {
                    return arg;
                }
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [default: {value}]"))
            });
        }
        cmd
    }

    /// The configuration these settings describe, defaults filled in.
    pub fn resolve(self) -> Result<ServerConfig, ConfigError> {
        let mut cfg = ServerConfig::default();
        self.put(&mut cfg)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

impl ServerConfig {
    /// The wire limits this configuration enforces.
    pub fn wire_limits(&self) -> Limits {
        Limits {
            max_frame_bytes: self.limits.max_frame_bytes,
            max_key_blocks: self.index.max_key_blocks,
            max_batch: self.limits.max_batch,
            max_name_len: self.index.max_name_len,
            max_candidates: self.limits.max_candidates,
        }
    }

    /// Checks every value: each setting's rule, then what spans two.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_each()?;
        self.transport.validate()?;
        self.replicas.validate()?;
        self.engines.validate(self.index.max_block_ratio)?;
        let receipts = &self.index.receipts;
        if receipts.suspect > receipts.window {
            return value::invalid(
                "receipt-suspect",
                &receipts.suspect,
                format!(
                    "more than --receipt-window ({}) could never make a pod suspect",
                    receipts.window
                ),
            );
        }
        if self.roles.enabled() && self.transport.client_ca.is_none() {
            return value::invalid(
                "reader/writer/peer-identity",
                &"set",
                "roles name client certificates: they need --client-ca (mutual TLS)",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
