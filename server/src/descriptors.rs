//! The process's open-file limit, raised at start to what the settings may
//! use: each HTTP connection holds a descriptor, each engine followed a few
//! (libzmq's sockets and their connections). A soft limit below that (1,024
//! under many shells and systemd units) would turn the settings' bounds
//! into `accept` failures and engines that cannot be followed.

use crate::ServerConfig;

/// Descriptors one followed engine may hold: its SUB socket and a replay
/// DEALER, each a libzmq mailbox and a TCP connection, and slack for a
/// reconnection that overlaps the old connection.
const PER_ENGINE: u64 = 6;

/// Descriptors for everything else: the QUIC socket, the listeners,
/// libzmq's I/O thread, the runtime, files being written.
const BASE: u64 = 256;

/// Descriptors the settings may use at once.
pub fn needed(cfg: &ServerConfig) -> u64 {
    let http = match cfg.transport.http_listen {
        Some(_) => cfg.transport.max_connections as u64,
        None => 0,
    };
    BASE + http + PER_ENGINE * cfg.engines.max_engines as u64
}

/// What raising the limit gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
    /// Descriptors the settings may use.
    pub needed: u64,
}

impl Raised {
    /// Whether the limit now covers what the settings may use.
    pub fn is_enough(&self) -> bool {
        self.now >= self.needed
    }
}

/// Raises the soft limit on open files to `needed`, or as far as the hard
/// limit lets it; never lowers it.
pub fn raise(needed: u64) -> std::io::Result<Raised> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is unlimited.
    let before = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let want = needed.min(hard);
    if want <= before {
        return Ok(Raised {
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
    Ok(Raised {
        before,
        now: want,
        needed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_listener_and_engines_count() {
        let mut cfg = ServerConfig::default();
        assert_eq!(needed(&cfg), BASE + PER_ENGINE * 1024);
        cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.transport.max_connections = 10_000;
        cfg.engines.max_engines = 2;
        assert_eq!(needed(&cfg), BASE + 10_000 + 2 * PER_ENGINE);
    }

    #[test]
    fn the_limit_is_raised_within_the_hard_limit_and_never_lowered() {
        // This process's own limit: raising it to what it already is
        // changes nothing; a tiny need never lowers it.
        let now = raise(0).unwrap();
        assert_eq!(now.before, now.now);
        assert!(now.is_enough());
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .maximum
            .unwrap_or(u64::MAX);
        let up = raise(now.now.saturating_add(1)).unwrap();
        assert_eq!(up.now, now.now.saturating_add(1).min(hard));
        let huge = raise(u64::MAX).unwrap();
        assert_eq!(huge.now, hard);
        assert_eq!(huge.is_enough(), hard == u64::MAX);
    }
}
