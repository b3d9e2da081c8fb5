//! The process's open-file limit, raised at start to what the settings may
//! use: each HTTP connection holds a descriptor, each engine followed one
//! or a few (its connection; the sockets of its own an engine named by
//! host name has; a replay's socket and connection while it runs). A soft
//! limit below that (1,024 under many shells and systemd units) would turn
//! the settings' bounds into `accept` failures and engines that cannot be
//! followed.

use crate::ServerConfig;

/// Descriptors an engine at an address holds: its connection (its sockets
/// are its shard's, counted in [`per_shard`]; libzmq closes a connection
/// before it reconnects).
const PER_ENGINE: u64 = 1;

/// Descriptors one libzmq socket holds: its mailbox's signal, one for an
/// eventfd (Linux, libzmq built as `.cargo/config.toml` asks), two for a
/// socket pair; seen from a socket of this build.
fn per_socket() -> u64 {
    crate::engines::descriptors_per_socket()
}

/// A watched SUB socket: the socket, its monitor and the PAIR that reads
/// the monitor. An engine named by host name has one of its own; an
/// engine sharing its address and topic with another opens one for its
/// group (`engines::seats`).
pub(crate) fn per_watched() -> u64 {
    3 * per_socket()
}

/// Descriptors a replay under way holds: its DEALER and its connection.
fn per_replay() -> u64 {
    per_socket() + 1
}

/// Descriptors an engine thread holds: its wake-up pair and its first
/// shared socket (`engines::shard`).
fn per_shard() -> u64 {
    2 + per_watched()
}

/// Descriptors for everything else: the QUIC socket, the listeners,
/// libzmq's threads, the runtime, files being written. With the default
/// two engine threads on Linux, 256 with theirs.
const BASE: u64 = 246;

/// What the settings need of the open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Without it `--max-engines` engines at an address cannot all be
    /// followed: the server does not start.
    pub required: u64,
    /// Everything the settings may use at once: every engine named by
    /// host name, every HTTP connection.
    pub wanted: u64,
}

/// Descriptors the settings may use.
pub fn open_files_needed(cfg: &ServerConfig) -> Needs {
    Needs {
        required: required(cfg),
        wanted: held(cfg) + per_watched() * cfg.engines.max_engines as u64,
    }
}

/// Descriptors without which `--max-engines` engines at an address cannot
/// all be followed.
fn required(cfg: &ServerConfig) -> u64 {
    let engines = &cfg.engines;
    BASE + per_shard() * engines.threads as u64
        + PER_ENGINE * engines.max_engines as u64
        + per_replay() * engines.max_replays as u64
}

/// Descriptors everything but the engines' watched sockets may hold at
/// once: what is required, and every HTTP connection. Those sockets get
/// what the limit leaves beyond it (`engines::seats`).
pub(crate) fn held(cfg: &ServerConfig) -> u64 {
    let http = match cfg.transport.http_listen {
        Some(_) => cfg.transport.max_connections as u64,
        None => 0,
    };
    required(cfg) + http
}

/// The soft limit on open files now (`u64::MAX` when unlimited).
pub(crate) fn soft_limit() -> u64 {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    // `None` is unlimited.
    limit.current.unwrap_or(u64::MAX)
}

/// What raising the limit gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
    /// Descriptors asked for.
    pub needed: u64,
}

impl OpenFiles {
    /// Whether the limit now covers what was asked for.
    pub fn is_enough(&self) -> bool {
        self.now >= self.needed
    }
}

/// Raises the soft limit on open files to `needed`, or as far as the hard
/// limit lets it; never lowers it.
pub fn raise_open_files(needed: u64) -> std::io::Result<OpenFiles> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let before = soft_limit();
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let want = needed.min(hard);
    if want <= before {
        return Ok(OpenFiles {
            before,
            now: before,
            needed,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want),
            maximum: limit.maximum,
        },
    )?;
    Ok(OpenFiles {
        before,
        now: want,
        needed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_replays_threads_and_the_http_listener_count() {
        let mut cfg = ServerConfig::default();
        let replays = per_replay() * 64;
        let threads = per_shard() * 2;
        let n = open_files_needed(&cfg);
        assert_eq!(n.required, BASE + threads + PER_ENGINE * 1024 + replays);
        assert_eq!(n.wanted, n.required + per_watched() * 1024);
        assert_eq!(held(&cfg), n.required);
        cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.transport.max_connections = 10_000;
        cfg.engines.max_engines = 10_000;
        cfg.engines.threads = 8;
        let n = open_files_needed(&cfg);
        let threads = per_shard() * 8;
        assert_eq!(n.required, BASE + threads + PER_ENGINE * 10_000 + replays);
        assert_eq!(n.wanted, n.required + 10_000 + per_watched() * 10_000);
        assert_eq!(held(&cfg), n.required + 10_000);
    }

    /// The figures the documentation gives, on Linux, at the defaults.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_defaults_need_what_the_documentation_says() {
        let n = open_files_needed(&ServerConfig::default());
        assert_eq!(n.required, 1_408);
    }

    #[test]
    fn the_limit_is_raised_within_the_hard_limit_and_never_lowered() {
        // This process's own limit: raising it to what it already is
        // changes nothing; a tiny need never lowers it.
        let now = raise_open_files(0).unwrap();
        assert_eq!(now.before, now.now);
        assert!(now.is_enough());
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .maximum
            .unwrap_or(u64::MAX);
        let up = raise_open_files(now.now.saturating_add(1)).unwrap();
        assert_eq!(up.now, now.now.saturating_add(1).min(hard));
        let huge = raise_open_files(u64::MAX).unwrap();
        assert_eq!(huge.now, hard);
        assert_eq!(huge.is_enough(), hard == u64::MAX);
    }
}
