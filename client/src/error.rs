//! Typed errors of the client library.

use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

use crate::pem::TlsError;
use crate::wire::{ErrorCode, WireError};

/// Why a call failed. Every variant is final for that call: the library never
/// retries behind the caller's back, because the caller's deadline is short
/// and a gateway would rather route on load alone than wait.
#[derive(Debug, Clone, Error)]
pub enum ClientError {
    /// No answer came within the call's deadline. The request may still be
    /// applied by the server.
    #[error("no answer within the {0:?} deadline")]
    Timeout(Duration),
    /// There is no connection to the server right now; the client is
    /// reconnecting in the background.
    #[error("not connected to {addr}: {reason}")]
    Disconnected {
        /// The server.
        addr: SocketAddr,
        /// Why the last connection ended, or why connecting failed.
        reason: String,
    },
    /// The server answered with an error.
    #[error("server error {code}: {message}")]
    Server {
        /// An [`ErrorCode`] number.
        code: u16,
        /// The server's detail.
        message: String,
    },
    /// The request breaks a protocol limit; it was not sent.
    #[error("invalid request: {0}")]
    Invalid(#[from] WireError),
    /// The server's answer did not fit the request (a bug on one side).
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The server's error code, if the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => ErrorCode::from_u16(*code),
            ClientError::Invalid(e) => Some(e.code()),
            _ => None,
        }
    }
}

/// Why [`crate::Client::connect`] failed.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// The TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The local UDP socket could not be opened.
    #[error("cannot open a UDP socket: {0}")]
    Io(#[from] std::io::Error),
    /// The server did not accept the connection.
    #[error("cannot connect to {addr}: {reason}")]
    Refused {
        /// The server.
        addr: SocketAddr,
        /// quinn's reason.
        reason: String,
    },
    /// A cluster was given no servers.
    #[error("a cluster needs at least one server")]
    NoServers,
    /// A cluster's replication factor is 0 or more than its servers.
    #[error("{replicas} replicas per model over {servers} servers: give 1 to {servers}")]
    Replicas {
        /// Replicas asked for.
        replicas: usize,
        /// Servers given.
        servers: usize,
    },
    /// The handshake did not finish within `connect_timeout`.
    #[error("no connection to {addr} within {timeout:?}")]
    Timeout {
        /// The server.
        addr: SocketAddr,
        /// The configured `connect_timeout`.
        timeout: Duration,
    },
}
