//! What a server does with the requests its streams read.
//!
//! The stream layer (transport settings, framing, heavy frames on the
//! blocking pool, back-pressure, drain at shutdown, busy polling) is the same
//! whatever answers the requests; a [`Service`] is the part that differs. The
//! index's [`Handler`](crate::handler::Handler) is the real one; the load
//! tester's echo baseline is another, so the baseline measures exactly the
//! server's transport path with no index work in it.

use prefix_proto::{ErrorCode, Limits, Reply, Request};

use crate::access::Access;

/// Writes a snapshot into the sink it is given; run on the blocking pool
/// while the stream layer sends what it writes.
pub type SnapshotJob = Box<dyn FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send>;

/// Answers decoded requests. Called on the async workers, or on the blocking
/// pool for requests it calls heavy.
pub trait Service: Send + Sync + 'static {
    /// Applies `request` for a client allowed `access`, and appends its
    /// response frame (request id `id`) to `out`.
    fn serve(&self, id: u64, request: &Request, access: &Access, out: &mut Vec<u8>);

    /// Whether `request` should run on the blocking pool, so that it holds up
    /// neither other connections nor the rest of its stream.
    fn is_heavy(&self, request: &Request) -> bool;

    /// Counts a frame refused before any of its ops was read.
    fn refused(&self);

    /// The limits requests are read against (frame size, batch size).
    fn limits(&self) -> &Limits;

    /// The job that writes this service's snapshot for a client allowed
    /// `access`, or the reply that refuses it. A service without an index
    /// has none to give.
    fn snapshot(&self, access: &Access) -> Result<SnapshotJob, Reply> {
        let _ = access;
        Err(ErrorCode::Unsupported.reply("this server keeps no index to send"))
    }
}
