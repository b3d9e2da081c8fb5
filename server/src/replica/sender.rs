//! The one snapshot a replica may be sending to a peer at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prefix_proto::{ErrorCode, Reply};

use super::Replica;

/// Whether a snapshot is being sent.
#[derive(Debug, Default)]
pub(super) struct Sender {
    sending: AtomicBool,
}

/// Held while a snapshot is being sent: the next request is refused.
pub struct Sending(Arc<Replica>);

impl Drop for Sending {
    fn drop(&mut self) {
        // Release: pairs with the Acquire swap in `Sender::start`.
        self.0.sender.sending.store(false, Ordering::Release);
    }
}

impl Sender {
    /// Starts sending `replica`'s snapshot, unless one is being sent: the
    /// refusal then.
    pub(super) fn start(&self, replica: Arc<Replica>) -> Result<Sending, Reply> {
        // Acquire: pairs with the Release in `Sending::drop`.
        if self.sending.swap(true, Ordering::Acquire) {
            return Err(ErrorCode::Unavailable.reply(
                "this replica is sending its snapshot to another peer: ask again, or ask another",
            ));
        }
        Ok(Sending(replica))
    }
}
