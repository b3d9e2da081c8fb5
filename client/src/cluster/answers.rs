//! Several servers' answers made into one: replies merged, samples
//! drawn from each in turn, spawned calls joined in order.

use crate::error::ClientError;
use crate::wire::{Reply, SampledKey};

/// Two servers' replies to one op as the cluster's: removed if either
/// removed, statistics summed, engine lists one after the other; replies
/// that carry nothing (done, pong) are one. A reply of another kind is
/// kept, for the caller to refuse.
pub(super) fn merge(acc: Reply, next: Reply) -> Reply {
    match (acc, next) {
        (Reply::Removed(a), Reply::Removed(b)) => Reply::Removed(a || b),
        (Reply::Stats(mut a), Reply::Stats(b)) => {
            a += &b;
            Reply::Stats(a)
        }
        (Reply::Engines(mut a), Reply::Engines(b)) => {
            a.extend(b);
            Reply::Engines(a)
        }
        (a, b) if a == b => a,
        (Reply::Done | Reply::Pong, other) | (other, _) => other,
    }
}

/// Up to `most` distinct keys from every server's sample, one from each
/// in turn (replicas hold the same keys: a key is taken once).
pub(super) fn sample(replies: Vec<Reply>, most: usize) -> Result<Vec<SampledKey>, ClientError> {
    let mut lists = Vec::with_capacity(replies.len());
    for reply in replies {
        match reply {
            Reply::Keys(keys) => lists.push(keys.into_iter()),
            other => return Err(crate::index::unexpected(other)),
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    while out.len() < most {
        let mut any = false;
        for list in &mut lists {
            if let Some(k) = list.next() {
                any = true;
                if out.len() < most && seen.insert((k.model.clone(), k.key.clone())) {
                    out.push(k);
                }
            }
        }
        if !any {
            break;
        }
    }
    Ok(out)
}

/// The answers of `n` calls spawned as `(position, answer)`, in position
/// order, or the first failure (by completion).
pub(super) async fn joined<T: 'static>(
    mut calls: tokio::task::JoinSet<(usize, Result<T, ClientError>)>,
    n: usize,
) -> Result<Vec<T>, ClientError> {
    let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None).take(n).collect();
    let mut first_err = None;
    while let Some(done) = calls.join_next().await {
        match done {
            Ok((i, Ok(v))) => out[i] = Some(v),
            Ok((_, Err(e))) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(ClientError::Protocol(format!("a call failed: {e}")));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    out.into_iter()
        .map(|v| v.ok_or_else(|| ClientError::Protocol("a call gave no answer".into())))
        .collect()
}
