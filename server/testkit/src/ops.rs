//! Strategies for the protocol's operations, which its binary fuzzer and
//! its JSON round trip both draw from.

use std::ops::Range;

use prefix_proto::{Op, OpKind};
use proptest::prelude::*;

/// A lookup of `kind` ([`OpKind::Lookup`], [`OpKind::LookupDetail`] or
/// [`OpKind::LookupTiers`]; any other kind panics): a model named by
/// `name`, a key of `key_len` hashes, and maybe up to three candidates
/// named by `name`.
pub fn lookup<S>(
    kind: OpKind,
    name: impl Fn() -> S,
    key_len: Range<usize>,
) -> impl Strategy<Value = Op>
where
    S: Strategy<Value = String>,
{
    type Make = fn(String, Vec<u64>, Option<Vec<String>>) -> Op;
    let make: Make = match kind {
        OpKind::Lookup => |model, key, candidates| Op::Lookup {
            model,
            key,
            candidates,
        },
        OpKind::LookupDetail => |model, key, candidates| Op::LookupDetail {
            model,
            key,
            candidates,
        },
        OpKind::LookupTiers => |model, key, candidates| Op::LookupTiers {
            model,
            key,
            candidates,
        },
        other => panic!("{other:?} is not a lookup"),
    };
    (
        name(),
        prop::collection::vec(any::<u64>(), key_len),
        prop::option::of(prop::collection::vec(name(), 0..4)),
    )
        .prop_map(move |(model, key, candidates)| make(model, key, candidates))
}
