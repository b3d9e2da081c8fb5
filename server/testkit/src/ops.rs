//! Strategies for the protocol's operations, which its binary fuzzer and
//! its JSON round trip both draw from.

use std::ops::Range;

use prefix_proto::{DigestAsk, DigestLevel, Op, OpKind, Receipt, Subscription};
use proptest::prelude::*;

/// Any operation: names (models, pods, and the other strings) drawn by
/// `name`, keys of `key_len` hashes, subscriptions by `subscription`.
pub fn op<S, E>(
    name: impl Fn() -> S + Copy + 'static,
    key_len: Range<usize>,
    subscription: E,
) -> impl Strategy<Value = Op>
where
    S: Strategy<Value = String> + 'static,
    E: Strategy<Value = Subscription> + 'static,
{
    let len = key_len.clone();
    let key = move || prop::collection::vec(any::<u64>(), len.clone());
    let levels = [
        DigestLevel::Models,
        DigestLevel::Cells,
        DigestLevel::Items,
        DigestLevel::Entries,
    ];
    let digest = (
        prop::sample::select(levels.to_vec()),
        name(),
        any::<u64>(),
        any::<u64>(),
    );
    let receipt = (name(), name(), key(), prop::option::of(any::<u32>()));
    prop_oneof![
        lookup(OpKind::Lookup, name, key_len.clone()),
        (name(), key(), name()).prop_map(|(model, key, pod)| Op::Insert { model, key, pod }),
        name().prop_map(|pod| Op::RemovePod { pod }),
        (name(), any::<u64>()).prop_map(|(pod, blocks)| Op::SetPodCapacity { pod, blocks }),
        Just(Op::Stats),
        Just(Op::Ping),
        subscription.prop_map(Op::Subscribe),
        name().prop_map(|pod| Op::Unsubscribe { pod }),
        Just(Op::ListEngines),
        (any::<u32>(), any::<u64>()).prop_map(|(count, seed)| Op::SampleKeys { count, seed }),
        lookup(OpKind::LookupDetail, name, key_len.clone()),
        lookup(OpKind::LookupTiers, name, key_len.clone()),
        (prop::option::of(any::<u64>()), any::<u32>())
            .prop_map(|(from, max)| Op::Tail { from, max }),
        (digest, prop::collection::vec(any::<u64>(), 0..8)).prop_map(
            |((level, model, low, high), of)| Op::Digest(DigestAsk {
                level,
                model,
                low,
                high,
                of,
            })
        ),
        (receipt, any::<u32>(), any::<u32>()).prop_map(
            |((model, pod, key, prompt_tokens), predicted_blocks, cached_tokens)| {
                Op::Receipt(Receipt {
                    model,
                    pod,
                    key,
                    prompt_tokens,
                    predicted_blocks,
                    cached_tokens,
                })
            }
        ),
    ]
}

/// A subscription whose endpoints are drawn by `endpoint` and its every
/// other string (pod, model, topic, media) by `name`.
pub fn subscription<S, P>(
    name: impl Fn() -> S,
    endpoint: impl Fn() -> P,
) -> impl Strategy<Value = Subscription>
where
    S: Strategy<Value = String>,
    P: Strategy<Value = String>,
{
    let names = (name(), name(), endpoint(), prop::option::of(endpoint()));
    (
        names,
        any::<u32>(),
        name(),
        prop::collection::vec(name(), 0..3),
    )
        .prop_map(
            |((pod, model, endpoint, replay), block_size, topic, media)| Subscription {
                pod,
                model,
                endpoint,
                replay,
                block_size,
                topic,
                media,
            },
        )
}

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
