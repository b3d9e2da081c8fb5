//! One server's writer: its bounded queue of writes, drained a batch of
//! what has queued up at a time.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::health::down;
use super::Counters;
use crate::client::Client;
use crate::error::ClientError;
use crate::wire::{Op, Reply};

/// A write for one server's writer, and where its answer goes.
pub(super) struct Write {
    pub(super) op: Op,
    pub(super) answer: mpsc::Sender<Result<Reply, ClientError>>,
}

impl std::fmt::Debug for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Write").field("op", &self.op).finish()
    }
}

/// Most writes one writer sends in one batch.
const WRITE_BATCH: usize = 256;

/// About the bytes `op` takes in a frame (bincode varints: a random hash
/// takes 9 bytes).
fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Insert { model, key, pod } => 16 + model.len() + pod.len() + 9 * key.len(),
        Op::Lookup { model, key, .. } => 16 + model.len() + 9 * key.len(),
        Op::Receipt(r) => 32 + r.model.len() + r.pod.len() + 9 * r.key.len(),
        _ => 64,
    }
}

/// Drains one server's write queue, a batch of what has queued at a time,
/// each batch within the client's frame and batch limits; a batch that
/// fails because the server is gone makes the server suspect.
pub(super) async fn writer(
    client: Client,
    mut queue: mpsc::Receiver<Write>,
    counters: Arc<Counters>,
    suspect: impl Fn(&Counters),
) {
    let limits = client.limits().clone();
    let most = WRITE_BATCH.min(limits.max_batch).max(1);
    // Half the frame: the estimate is rough, and the margin is cheap.
    let budget = limits.frame_bytes() as usize / 2;
    let mut batch: Vec<Write> = Vec::with_capacity(most);
    let mut carried: Option<Write> = None;
    loop {
        let first = match carried.take() {
            Some(w) => w,
            None => match queue.recv().await {
                Some(w) => w,
                None => return,
            },
        };
        let mut size = op_bytes(&first.op);
        batch.push(first);
        while batch.len() < most {
            match queue.try_recv() {
                Ok(w) => {
                    let s = op_bytes(&w.op);
                    if size + s > budget {
                        carried = Some(w);
                        break;
                    }
                    size += s;
                    batch.push(w);
                }
                Err(_) => break,
            }
        }
        let ops = batch.iter().map(|w| w.op.clone()).collect();
        let n = batch.len() as u64;
        // Relaxed: counters, read for reports only.
        match client.batch(ops).await {
            Ok(replies) => {
                counters.applied.fetch_add(n, Ordering::Relaxed);
                for (w, reply) in batch.drain(..).zip(replies) {
                    let _ = w.answer.try_send(Ok(reply));
                }
            }
            Err(e) => {
                counters.failed.fetch_add(n, Ordering::Relaxed);
                // Gone, not merely slow: a slow batch of writes says
                // little about lookups.
                if down(&e) {
                    suspect(&counters);
                }
                for w in batch.drain(..) {
                    let _ = w.answer.try_send(Err(e.clone()));
                }
            }
        }
    }
}
