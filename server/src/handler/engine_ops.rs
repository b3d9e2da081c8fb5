//! The engine ops (`subscribe`, `unsubscribe`, `list_engines`): the
//! handler hands them to the server's [`Engines`], one by one or, for a run
//! of them in a batch, in one step.

use std::sync::Arc;

use prefix_index::{EngineError, PodError};
use prefix_proto::{EngineState, ErrorCode, Op, Reply, Subscription};

use super::{not_applied, Handler, Replies};
use crate::access::Access;
use crate::engines::{wire, Engines, SubscribeError};
use crate::metrics::{self, Tally};

/// The refusal of a subscription, with the code a client can act on.
pub(super) fn subscription_error(e: &SubscribeError) -> Reply {
    let code = match e {
        SubscribeError::Index {
            source: EngineError::Pod(PodError::BadName { .. } | PodError::Reserved),
            ..
        } => ErrorCode::BadName,
        SubscribeError::Index {
            source: EngineError::Pod(PodError::TooManyPods { .. }),
            ..
        } => ErrorCode::TooManyPods,
        // The OS refused a thread: the server is short of resources.
        SubscribeError::Thread(_) => ErrorCode::Unavailable,
        _ => ErrorCode::BadSubscription,
    };
    code.reply(e)
}

/// Starts following `sub`'s engine.
pub(super) fn subscribe(engines: &Arc<Engines>, sub: &Subscription) -> Reply {
    let started = wire::accept(sub.clone())
        .map_err(SubscribeError::from)
        .and_then(|sub| engines.subscribe(sub));
    match started {
        Ok(()) => Reply::Done,
        Err(e) => subscription_error(&e),
    }
}

/// Every subscription and its state.
pub(super) fn list_engines(engines: &Arc<Engines>) -> Reply {
    let list = engines.list().into_iter();
    Reply::Engines(
        list.map(|(sub, status)| EngineState { sub, status })
            .collect(),
    )
}

impl Handler {
    /// `f`'s reply, or `Unsupported` from a handler without engines.
    pub(super) fn with_engines(&self, f: impl FnOnce(&Arc<Engines>) -> Reply) -> Reply {
        match &self.engines {
            Some(engines) => f(engines),
            None => ErrorCode::Unsupported.reply("this server does not follow engines"),
        }
    }

    /// Applies a run of `subscribe` ops (two or more in a row of a batch)
    /// in one step ([`Engines::subscribe_all`]), writes their replies in
    /// order and counts them.
    pub(super) fn subscribe_run(
        &self,
        engines: &Arc<Engines>,
        ops: &[Op],
        access: &Access,
        now: u64,
        tally: &mut Tally,
        w: &mut impl Replies,
    ) {
        // Each answer, and whether its op was applied (refused or held
        // ones are not recorded for the replicas' tail).
        let mut replies: Vec<Option<(Reply, bool)>> = vec![None; ops.len()];
        let mut taken = Vec::new();
        let subs = ops.iter().filter_map(|op| match op {
            Op::Subscribe(sub) => Some((op, sub)),
            _ => None,
        });
        for (i, (op, sub)) in subs.enumerate() {
            if let Some(refusal) = self.refusal(op, access, now) {
                replies[i] = Some((refusal, false));
                continue;
            }
            match wire::accept(sub.clone()) {
                Ok(sub) => taken.push((i, sub)),
                Err(e) => {
                    replies[i] = Some((subscription_error(&SubscribeError::from(e)), true));
                }
            }
        }
        let (at, subs): (Vec<usize>, Vec<_>) = taken.into_iter().unzip();
        for (i, result) in at.into_iter().zip(engines.subscribe_all(subs)) {
            let reply = match result {
                Ok(()) => Reply::Done,
                Err(e) => subscription_error(&e),
            };
            replies[i] = Some((reply, true));
        }
        for (op, reply) in ops.iter().zip(replies) {
            // Every op of the run is a `subscribe`, answered above.
            let failed = match reply {
                Some((reply, true)) => self.answer(op, &reply, now, w),
                Some((reply, false)) => not_applied(&reply, w),
                None => not_applied(&ErrorCode::Internal.reply("not a subscribe op"), w),
            };
            tally.add(metrics::op_slot(op), failed);
        }
    }

    /// Applies a run of `unsubscribe` ops (two or more in a row of a batch)
    /// in one step ([`Engines::unsubscribe_all`]), writes their replies in
    /// order and counts them.
    pub(super) fn unsubscribe_run(
        &self,
        engines: &Engines,
        ops: &[Op],
        access: &Access,
        now: u64,
        tally: &mut Tally,
        w: &mut impl Replies,
    ) {
        // Each op's refusal, if refused or held; the pods of the others.
        let mut pods = Vec::new();
        let mut refusals = Vec::with_capacity(ops.len());
        for op in ops {
            let refusal = self.refusal(op, access, now);
            match (op, &refusal) {
                (Op::Unsubscribe { pod }, None) => pods.push(pod.as_str()),
                (_, None) => {
                    refusals.push(Some(ErrorCode::Internal.reply("not an unsubscribe op")));
                    continue;
                }
                _ => {}
            }
            refusals.push(refusal);
        }
        let mut removed = engines.unsubscribe_all(&pods).into_iter();
        for (op, refusal) in ops.iter().zip(refusals) {
            let failed = match refusal {
                Some(reply) => not_applied(&reply, w),
                // One answer per pod given, in order.
                None => match removed.next() {
                    Some(was) => self.answer(op, &Reply::Removed(was), now, w),
                    None => not_applied(&ErrorCode::Internal.reply("no answer"), w),
                },
            };
            tally.add(metrics::op_slot(op), failed);
        }
    }
}
