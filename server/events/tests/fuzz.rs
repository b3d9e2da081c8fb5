//! The decoders under a fuzzer (proptest, on stable): arbitrary bytes,
//! generated batches in every layout (which must round-trip), and those and
//! the golden vectors cut and mutated. Nothing may panic, every failure is a
//! typed error, and no input may make the decoder reserve memory out of
//! proportion to its length (a counting allocator records the largest single
//! allocation).
//!
//! `cargo test` runs a few thousand cases; the long run is
//! `FUZZ_CASES=1000000 cargo test --release -p prefix-events --test fuzz -- --include-ignored`.

use std::alloc::System;
use std::path::Path;

use compact_str::CompactString;
use counting_alloc::Counting;
use prefix_events::{
    decode_batch, parse_live, parse_replay, parse_topic, Batch, DecodeError, DecodeLimits, Event,
    RawExtraKey, Removed, Stored,
};
use prefix_testkit::fuzz::{self, cases, mutate, Mutation};
use proptest::prelude::*;
use rmp::encode as enc;

/// The system allocator, recording the largest request (tests read and reset
/// it around one decode).
#[global_allocator]
static ALLOC: Counting<System> = Counting::new(System);

/// Runs `test` on `cases` inputs from `strategy`.
fn check<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// The most one decode may reserve at once for `len` payload bytes: a list
/// reserves at most one element per byte left, so the widest element a
/// one-byte item can yield sets the rate. That is an extra key (a fixint or
/// an empty string is one byte and one `RawExtraKey`); a hash is 8 bytes, a
/// token id 4, a block's key list 16, and the events at most one per 15
/// bytes (about 8 bytes of `Event` per payload byte). Plus slack for small
/// fixed allocations.
fn bound(len: usize) -> usize {
    let widest = size_of::<RawExtraKey>().max(size_of::<Option<Box<[RawExtraKey]>>>());
    widest * len + 4096
}

/// Decodes `bytes` (and parses it as frames), checks the allocation bound,
/// and returns the decode result. The bound is checked on this thread's
/// allocations alone: the test harness's threads allocate meanwhile.
fn decode_checked(
    bytes: &[u8],
    limits: &DecodeLimits,
) -> Result<Result<Batch, DecodeError>, TestCaseError> {
    ALLOC.reset_largest_here();
    let outcome = decode_batch(bytes, limits);
    let largest = ALLOC.largest_here();
    prop_assert!(
        largest <= bound(bytes.len()),
        "{} input bytes made a {largest}-byte allocation (bound {})",
        bytes.len(),
        bound(bytes.len())
    );
    if let Err(e) = &outcome {
        // Typed, with a message.
        let _ = e.to_string();
    }
    Ok(outcome)
}

/// Every entry point on `bytes`: the payload decoder with the default limits
/// and with none, and the frame parsers on frames cut from it.
fn decode_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    let limited = decode_checked(bytes, &DecodeLimits::default())?;
    let unlimited = DecodeLimits {
        max_events: usize::MAX,
        max_hashes: usize::MAX,
        max_tokens: usize::MAX,
    };
    let unlimited = decode_checked(bytes, &unlimited)?;
    // Limits change the outcome only by refusing with `Limit`: the batch,
    // or events skipped alone (one more of them than without limits, or
    // the first one's reason). (Compared as text: a NaN `ts` never equals
    // itself.)
    let bad = |o: &Result<Batch, DecodeError>| o.as_ref().ok().and_then(|b| b.bad.clone());
    let limit_skipped = match (bad(&limited), bad(&unlimited)) {
        (Some(l), u) => {
            matches!(l.first, DecodeError::Limit { .. }) || Some(l.count) != u.map(|u| u.count)
        }
        (None, _) => false,
    };
    if !matches!(limited, Err(DecodeError::Limit { .. })) && !limit_skipped {
        prop_assert_eq!(format!("{limited:?}"), format!("{unlimited:?}"));
    }
    let third = bytes.len() / 3;
    let (a, rest) = bytes.split_at(third);
    let (b, c) = rest.split_at(third.min(rest.len()));
    for frames in [vec![a, b, c], vec![&b""[..], a, b, c], vec![b, c]] {
        if let Err(e) = parse_live(&frames) {
            let _ = e.to_string();
        }
        if let Err(e) = parse_replay(&frames) {
            let _ = e.to_string();
        }
    }
    let _ = parse_topic(bytes);
    Ok(())
}

// --- Generated batches, encoded in every layout ----------------------------

/// How a hash is written.
#[derive(Debug, Clone, Copy)]
enum HashForm {
    /// vLLM: unsigned int.
    Uint,
    /// SGLang: signed int64 (the same 64 bits).
    Sint,
    /// vLLM with int hashes off: a 32- or 16-byte digest ending in the hash.
    Bin(usize),
}

#[derive(Debug, Clone)]
struct Layout {
    hash: HashForm,
    /// Events as tagged maps (else tagged arrays).
    map_events: bool,
    /// In map events, `"type"` last rather than first.
    type_last: bool,
    /// The batch as a map (else an array).
    map_batch: bool,
    /// Unknown events to put before each known one.
    unknown: Vec<bool>,
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        prop_oneof![
            Just(HashForm::Uint),
            Just(HashForm::Sint),
            Just(HashForm::Bin(32)),
            Just(HashForm::Bin(16)),
        ],
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::collection::vec(prop::bool::weighted(0.2), 0..8),
    )
        .prop_map(|(hash, map_events, type_last, map_batch, unknown)| Layout {
            hash,
            map_events,
            type_last,
            map_batch,
            unknown,
        })
}

/// A LoRA adapter's or a tier's name, inline (up to 24 bytes) or not.
fn label() -> impl Strategy<Value = Option<CompactString>> {
    prop::option::of("[A-Za-z0-9_/.-]{1,40}".prop_map(CompactString::from))
}

/// Per-block extra keys of every shape; nil for every block decodes as
/// none at all, so such lists are generated as empty.
fn extra_keys() -> impl Strategy<Value = Vec<Option<Box<[RawExtraKey]>>>> {
    let key = prop_oneof![
        "[a-z0-9-]{1,30}".prop_map(|t| RawExtraKey::Text(t.into())),
        (prop::collection::vec(any::<u8>(), 0..40), any::<i64>()).prop_map(|(id, offset)| {
            RawExtraKey::Mm {
                identifier: id.into(),
                offset,
            }
        }),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| RawExtraKey::Bytes(b.into())),
        Just(RawExtraKey::Unknown),
    ];
    let block = prop::option::of(prop::collection::vec(key, 0..4).prop_map(Vec::into_boxed_slice));
    prop::collection::vec(block, 0..5).prop_map(|blocks| {
        if blocks.iter().all(Option::is_none) {
            Vec::new()
        } else {
            blocks
        }
    })
}

/// A `u32`, or nil.
fn write_opt_u32(out: &mut Vec<u8>, v: Option<u32>) {
    match v {
        Some(v) => drop(enc::write_uint(out, u64::from(v))),
        None => drop(enc::write_nil(out)),
    }
}

/// Writes `extra_keys` as vLLM does: a list per block, or nil; an unknown
/// shape as an int.
fn write_extra_keys(out: &mut Vec<u8>, keys: &[Option<Box<[RawExtraKey]>>]) {
    let _ = enc::write_array_len(out, keys.len() as u32);
    for block in keys {
        let Some(block) = block else {
            let _ = enc::write_nil(out);
            continue;
        };
        let _ = enc::write_array_len(out, block.len() as u32);
        for key in block.iter() {
            match key {
                RawExtraKey::Text(t) => drop(enc::write_str(out, t)),
                RawExtraKey::Mm { identifier, offset } => {
                    let _ = enc::write_array_len(out, 2);
                    match std::str::from_utf8(identifier) {
                        Ok(id) => drop(enc::write_str(out, id)),
                        Err(_) => drop(enc::write_bin(out, identifier)),
                    }
                    let _ = enc::write_sint(out, *offset);
                }
                RawExtraKey::Bytes(b) => drop(enc::write_bin(out, b)),
                RawExtraKey::Unknown => drop(enc::write_uint(out, 1)),
            }
        }
    }
}

fn event() -> impl Strategy<Value = Event> {
    let hashes = prop::collection::vec(any::<u64>(), 0..6);
    prop_oneof![
        (
            hashes.clone(),
            prop::option::of(any::<u64>()),
            prop::collection::vec(any::<u32>(), 0..40),
            any::<u32>(),
            label(),
            label(),
            (extra_keys(), label()),
            (
                prop::option::of(any::<u32>()),
                label(),
                prop::option::of(any::<u32>()),
            ),
        )
            .prop_map(
                |(
                    hashes,
                    parent,
                    tokens,
                    block_size,
                    lora_name,
                    medium,
                    (extra_keys, salt),
                    (group, group_kind, sliding_window),
                )| {
                    Event::Stored(Stored {
                        hashes,
                        parent,
                        tokens,
                        block_size,
                        lora_name,
                        medium,
                        extra_keys,
                        cache_salt: salt,
                        lookahead: false,
                        group,
                        group_kind,
                        sliding_window,
                    })
                },
            ),
        (hashes, label(), prop::option::of(any::<u32>())).prop_map(|(hashes, medium, group)| {
            Event::Removed(Removed {
                hashes: hashes.into(),
                medium,
                group,
            })
        }),
        Just(Event::Cleared),
    ]
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        any::<f64>().prop_filter("NaN never equals itself", |ts| !ts.is_nan()),
        prop::collection::vec(event(), 0..8),
        prop::option::of(any::<u32>()),
    )
        .prop_map(|(ts, events, data_parallel_rank)| Batch {
            ts,
            events,
            data_parallel_rank,
            unknown_events: 0,
            bad: None,
        })
}

fn write_hash(out: &mut Vec<u8>, h: u64, form: HashForm) {
    match form {
        HashForm::Uint => drop(enc::write_uint(out, h)),
        // The same 64 bits as an i64, as SGLang sends them.
        HashForm::Sint => drop(enc::write_sint(out, h as i64)),
        HashForm::Bin(len) => {
            let mut digest = vec![0xa5; len - 8];
            digest.extend_from_slice(&h.to_be_bytes());
            drop(enc::write_bin(out, &digest));
        }
    }
}

fn write_opt_str(out: &mut Vec<u8>, s: &Option<CompactString>) {
    match s {
        Some(s) => drop(enc::write_str(out, s)),
        None => drop(enc::write_nil(out)),
    }
}

/// The map entry `key` = `value` when there is a value (msgspec's
/// `omit_defaults` leaves it out otherwise).
fn write_some_str(out: &mut Vec<u8>, key: &str, value: &Option<CompactString>) {
    if let Some(value) = value {
        let _ = enc::write_str(out, key);
        let _ = enc::write_str(out, value);
    }
}

/// [`write_some_str`] for a number.
fn write_some_u32(out: &mut Vec<u8>, key: &str, value: Option<u32>) {
    if let Some(value) = value {
        let _ = enc::write_str(out, key);
        let _ = enc::write_uint(out, u64::from(value));
    }
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64], form: HashForm) {
    let _ = enc::write_array_len(out, hashes.len() as u32);
    for &h in hashes {
        write_hash(out, h, form);
    }
}

fn write_unknown(out: &mut Vec<u8>, map: bool) {
    if map {
        let _ = enc::write_map_len(out, 2);
        let _ = enc::write_str(out, "type");
        let _ = enc::write_str(out, "BlockPinned");
        let _ = enc::write_str(out, "pins");
        out.extend_from_slice(&[0x92, 0x91, 0xc0, 0x80]);
    } else {
        let _ = enc::write_array_len(out, 2);
        let _ = enc::write_str(out, "KvCacheResized");
        let _ = enc::write_uint(out, 4096);
    }
}

fn write_event(out: &mut Vec<u8>, e: &Event, l: &Layout) {
    if !l.map_events {
        match e {
            Event::Stored(s) => {
                let _ = enc::write_array_len(out, 12);
                let _ = enc::write_str(out, "BlockStored");
                write_hashes(out, &s.hashes, l.hash);
                match s.parent {
                    Some(p) => write_hash(out, p, l.hash),
                    None => drop(enc::write_nil(out)),
                }
                let _ = enc::write_array_len(out, s.tokens.len() as u32);
                for &t in &s.tokens {
                    let _ = enc::write_uint(out, u64::from(t));
                }
                let _ = enc::write_uint(out, u64::from(s.block_size));
                let _ = enc::write_nil(out); // lora_id
                write_opt_str(out, &s.medium);
                // SGLang's metadata map where vLLM has `lora_name`.
                match &s.cache_salt {
                    Some(salt) => {
                        let _ = enc::write_map_len(out, 1);
                        let _ = enc::write_str(out, "cache_salt");
                        let _ = enc::write_str(out, salt);
                    }
                    None => write_opt_str(out, &s.lora_name),
                }
                write_extra_keys(out, &s.extra_keys);
                write_opt_u32(out, s.group);
                write_opt_str(out, &s.group_kind);
                write_opt_u32(out, s.sliding_window);
            }
            Event::Removed(r) => {
                let _ = enc::write_array_len(out, 4);
                let _ = enc::write_str(out, "BlockRemoved");
                write_hashes(out, &r.hashes, l.hash);
                write_opt_str(out, &r.medium);
                write_opt_u32(out, r.group);
            }
            Event::Cleared => {
                let _ = enc::write_array_len(out, 1);
                let _ = enc::write_str(out, "AllBlocksCleared");
            }
        }
        return;
    }
    let (tag, fields) = match e {
        Event::Stored(s) => (
            "BlockStored",
            8 + u16::from(s.cache_salt.is_some())
                + u16::from(s.group.is_some())
                + u16::from(s.group_kind.is_some())
                + u16::from(s.sliding_window.is_some()),
        ),
        Event::Removed(r) => ("BlockRemoved", 3 + u16::from(r.group.is_some())),
        Event::Cleared => ("AllBlocksCleared", 1),
    };
    // map16 even when small, as msgspec writes BlockStored.
    out.push(0xde);
    out.extend_from_slice(&fields.to_be_bytes());
    let write_type = |out: &mut Vec<u8>| {
        let _ = enc::write_str(out, "type");
        let _ = enc::write_str(out, tag);
    };
    if !l.type_last {
        write_type(out);
    }
    match e {
        Event::Stored(s) => {
            let _ = enc::write_str(out, "block_hashes");
            write_hashes(out, &s.hashes, l.hash);
            let _ = enc::write_str(out, "parent_block_hash");
            match s.parent {
                Some(p) => write_hash(out, p, l.hash),
                None => drop(enc::write_nil(out)),
            }
            let _ = enc::write_str(out, "token_ids");
            let _ = enc::write_array_len(out, s.tokens.len() as u32);
            for &t in &s.tokens {
                let _ = enc::write_uint(out, u64::from(t));
            }
            let _ = enc::write_str(out, "block_size");
            let _ = enc::write_uint(out, u64::from(s.block_size));
            let _ = enc::write_str(out, "medium");
            write_opt_str(out, &s.medium);
            let _ = enc::write_str(out, "lora_name");
            write_opt_str(out, &s.lora_name);
            let _ = enc::write_str(out, "extra_keys");
            write_extra_keys(out, &s.extra_keys);
            write_some_str(out, "cache_salt", &s.cache_salt);
            write_some_u32(out, "group_idx", s.group);
            write_some_str(out, "kv_cache_spec_kind", &s.group_kind);
            write_some_u32(out, "kv_cache_spec_sliding_window", s.sliding_window);
        }
        Event::Removed(r) => {
            let _ = enc::write_str(out, "block_hashes");
            write_hashes(out, &r.hashes, l.hash);
            let _ = enc::write_str(out, "medium");
            write_opt_str(out, &r.medium);
            write_some_u32(out, "group_idx", r.group);
        }
        Event::Cleared => {}
    }
    if l.type_last {
        write_type(out);
    }
}

/// `batch` in layout `l`, and the batch it must decode to (with its unknown
/// events counted).
fn encode(batch: &Batch, l: &Layout) -> (Vec<u8>, Batch) {
    let mut events = Vec::new();
    let mut unknown = 0;
    for (i, e) in batch.events.iter().enumerate() {
        if l.unknown.get(i).copied().unwrap_or(false) {
            write_unknown(&mut events, i % 2 == 0);
            unknown += 1;
        }
        write_event(&mut events, e, l);
    }
    let count = batch.events.len() as u32 + unknown;
    let mut out = Vec::new();
    let write_rank = |out: &mut Vec<u8>| match batch.data_parallel_rank {
        Some(r) => drop(enc::write_uint(out, u64::from(r))),
        None => drop(enc::write_nil(out)),
    };
    if l.map_batch {
        let _ = enc::write_map_len(&mut out, 3);
        let _ = enc::write_str(&mut out, "events");
        let _ = enc::write_array_len(&mut out, count);
        out.extend_from_slice(&events);
        let _ = enc::write_str(&mut out, "attn_dp_rank");
        write_rank(&mut out);
        let _ = enc::write_str(&mut out, "ts");
        let _ = enc::write_f64(&mut out, batch.ts);
    } else {
        let _ = enc::write_array_len(&mut out, 3);
        let _ = enc::write_f64(&mut out, batch.ts);
        let _ = enc::write_array_len(&mut out, count);
        out.extend_from_slice(&events);
        write_rank(&mut out);
    }
    let mut want = Batch {
        unknown_events: unknown,
        bad: None,
        ..batch.clone()
    };
    if !l.map_events {
        // The array form has SGLang's salt where vLLM has `lora_name`.
        for e in &mut want.events {
            if let Event::Stored(s) = e {
                if s.cache_salt.is_some() {
                    s.lora_name = None;
                }
            }
        }
    }
    (out, want)
}

// --- Mutations -------------------------------------------------------------------

/// A mutation of a valid payload: flip bits, cut, splice in a run.
fn mutation() -> impl Strategy<Value = Mutation> {
    // 0xdc/0xdd/0xde/0xdf are array16/32 and map16/32 headers, 0xc6 and
    // 0xdb bin32/str32, 0xff a length byte: the ways to claim a huge
    // container in a few bytes; 0x91 nests.
    fuzz::mutation(&[0xdd, 0xdf, 0xdc, 0xc6, 0xdb, 0xff, 0x91])
}

fn golden() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "msgpack"))
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    out.sort();
    assert!(!out.is_empty());
    out
}

/// The bytes, and the same bytes behind a valid batch head (so they reach
/// the events).
fn arbitrary_bytes(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    decode_all(&bytes)?;
    let mut headed = vec![0x93, 0xcb, 0x41, 0xda, 0, 0, 0, 0, 0, 0];
    headed.extend_from_slice(&bytes);
    decode_all(&headed)
}

/// A generated batch decodes to itself; mutated, it fails typed.
fn round_trip((batch, layout, muts): (Batch, Layout, Vec<Mutation>)) -> Result<(), TestCaseError> {
    let (payload, want) = encode(&batch, &layout);
    let got = decode_checked(&payload, &DecodeLimits::default())?;
    prop_assert_eq!(got, Ok(want));
    decode_all(&mutate(payload, &muts))
}

#[test]
fn arbitrary_bytes_fail_typed_and_small() {
    check(
        cases(2000),
        prop::collection::vec(any::<u8>(), 0..512),
        arbitrary_bytes,
    );
}

#[test]
fn generated_batches_round_trip_and_mutants_fail_typed() {
    check(
        cases(2000),
        (batch(), layout(), prop::collection::vec(mutation(), 1..4)),
        round_trip,
    );
}

#[test]
fn golden_vectors_cut_and_mutated_fail_typed() {
    let vectors = golden();
    check(
        cases(2000),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(mutation(), 1..6),
        ),
        |(which, muts)| decode_all(&mutate(vectors[which.index(vectors.len())].clone(), &muts)),
    );
}

/// Every prefix of every golden vector is refused as truncated (a payload is
/// one value: a cut one can never decode), and cheaply.
#[test]
fn every_prefix_of_a_golden_vector_is_truncated() {
    for payload in golden() {
        for len in 0..payload.len() {
            let outcome = decode_checked(&payload[..len], &DecodeLimits::default()).unwrap();
            assert!(
                matches!(outcome, Err(DecodeError::Truncated { .. })),
                "{len} of {} bytes: {outcome:?}",
                payload.len()
            );
        }
    }
}

/// The classic attack, spelled out: a few bytes claiming 2^32 - 1 events,
/// hashes or token ids, with no limits to stop it, only the bytes left.
#[test]
fn huge_length_fields_in_tiny_payloads_are_refused_cheaply() {
    let head = [0x93, 0xcb, 0x41, 0xda, 0, 0, 0, 0, 0, 0];
    let claim = [0xdd, 0xff, 0xff, 0xff, 0xff];
    // 2^32 - 1 events claimed, eight ["AllBlocksCleared"] there.
    let mut events_bomb = head.to_vec();
    events_bomb.extend_from_slice(&claim);
    for _ in 0..8 {
        events_bomb.extend_from_slice(b"\x91\xb0AllBlocksCleared");
    }
    // One array event, ["BlockRemoved", array32 claim, ...].
    let mut hashes_bomb = head.to_vec();
    hashes_bomb.extend_from_slice(&[0x91, 0x92, 0xac]);
    hashes_bomb.extend_from_slice(b"BlockRemoved");
    hashes_bomb.extend_from_slice(&claim);
    hashes_bomb.extend_from_slice(&[0x01; 64]);
    // One array event, ["BlockStored", [], nil, array32 claim, ...].
    let mut tokens_bomb = head.to_vec();
    tokens_bomb.extend_from_slice(&[0x91, 0x95, 0xab]);
    tokens_bomb.extend_from_slice(b"BlockStored");
    tokens_bomb.extend_from_slice(&[0x90, 0xc0]);
    tokens_bomb.extend_from_slice(&claim);
    tokens_bomb.extend_from_slice(&[0x01; 64]);
    let unlimited = DecodeLimits {
        max_events: usize::MAX,
        max_hashes: usize::MAX,
        max_tokens: usize::MAX,
    };
    // One array event whose one block has 4,096 one-byte keys: the widest
    // element per payload byte there is.
    let mut keys_bomb = head.to_vec();
    keys_bomb.extend_from_slice(&[0x91, 0x99, 0xab]);
    keys_bomb.extend_from_slice(b"BlockStored");
    keys_bomb.extend_from_slice(&[0x91, 0x01, 0xc0, 0x90, 0x10, 0xc0, 0xc0, 0xc0]);
    keys_bomb.extend_from_slice(&[0x91, 0xdc, 0x10, 0x00]);
    keys_bomb.extend_from_slice(&[0x01; 4096]);
    keys_bomb.push(0xc0); // data_parallel_rank
    let outcome = decode_checked(&keys_bomb, &unlimited).unwrap();
    let Ok(Batch { events, .. }) = outcome else {
        panic!("{outcome:?}")
    };
    let [Event::Stored(stored)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(stored.extra_keys[0].as_deref().map(<[_]>::len), Some(4096));
    for bomb in [events_bomb, hashes_bomb, tokens_bomb] {
        for limits in [DecodeLimits::default(), unlimited.clone()] {
            let outcome = decode_checked(&bomb, &limits).unwrap();
            assert!(
                matches!(
                    outcome,
                    Err(DecodeError::Truncated { .. } | DecodeError::Limit { .. })
                ),
                "{outcome:?}"
            );
        }
    }
}

/// The long run: `FUZZ_CASES` (default 200,000) cases of each property.
#[test]
#[ignore = "long fuzzing run; see the module docs"]
fn long_run() {
    let n = cases(200_000);
    check(
        n,
        prop::collection::vec(any::<u8>(), 0..4096),
        arbitrary_bytes,
    );
    check(
        n,
        (batch(), layout(), prop::collection::vec(mutation(), 1..6)),
        round_trip,
    );
    let vectors = golden();
    check(
        n,
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(mutation(), 1..8),
        ),
        |(which, muts)| decode_all(&mutate(vectors[which.index(vectors.len())].clone(), &muts)),
    );
}
