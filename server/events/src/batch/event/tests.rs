use super::super::testing::{batch_of, W};
use super::super::{decode_batch, Batch, RawExtraKey};
use super::*;

fn decode(events: &[Vec<u8>]) -> Result<Batch, DecodeError> {
    decode_batch(&batch_of(events), &DecodeLimits::default())
}

/// Why the batch did not decode, or else its first bad event.
fn why(got: Result<Batch, DecodeError>) -> String {
    match got {
        Err(e) => e.to_string(),
        Ok(b) => b
            .bad
            .map_or_else(|| "decoded".into(), |b| b.first.to_string()),
    }
}

fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> Event {
    Event::Stored(Stored {
        hashes,
        parent,
        tokens,
        block_size: 2,
        lora_name: None,
        medium: None,
        ..Default::default()
    })
}

/// A map-form event of `fields` fields, the first its tag.
fn tagged_map(fields: u32, tag: &str) -> W {
    W::default().map(fields).s("type").s(tag)
}

/// An array-form event of `fields` fields, the first its tag.
fn tagged_array(fields: u32, tag: &str) -> W {
    W::default().arr(fields).s(tag)
}

/// An array-form `BlockStored` of `fields` fields, the first three its
/// tag, no hashes and no parent.
fn orphan_array_store(fields: u32) -> W {
    tagged_array(fields, "BlockStored").arr(0).nil()
}

/// A map-form `BlockStored` of `fields` fields, the first four its tag, no
/// hashes, no tokens and `block_size`.
fn empty_store(fields: u32, block_size: u64) -> W {
    tagged_map(fields, "BlockStored")
        .s("block_hashes")
        .arr(0)
        .s("token_ids")
        .arr(0)
        .s("block_size")
        .u(block_size)
}

#[test]
fn map_events_in_any_key_order_with_unknown_keys() {
    let e = W::default()
        .map(6)
        .s("token_ids")
        .arr(2)
        .u(1)
        .u(2)
        .s("future")
        .map(1)
        .s("x")
        .arr(1)
        .nil()
        .s("block_size")
        .u(2)
        .s("type")
        .s("BlockStored")
        .s("parent_block_hash")
        .u(u64::MAX)
        .s("block_hashes")
        .arr(1)
        .u(5)
        .done();
    let batch = decode(&[e]).unwrap();
    assert_eq!(batch.events, [stored(vec![5], Some(u64::MAX), vec![1, 2])]);
}

#[test]
fn absent_optional_fields_are_none() {
    // SGLang omits medium/lora_name when None (omit_defaults), and a
    // stripped-down publisher may omit the parent.
    let e = empty_store(4, 2).done();
    assert_eq!(decode(&[e]).unwrap().events, [stored(vec![], None, vec![])]);
    let e = W::default()
        .map(2)
        .s("block_hashes")
        .arr(1)
        .u(9)
        .s("type")
        .s("BlockRemoved")
        .done();
    assert_eq!(
        decode(&[e]).unwrap().events,
        [Event::Removed(Removed {
            hashes: [9].into(),
            medium: None,
            group: None,
        })]
    );
}

#[test]
fn array_events_of_every_length_the_engines_sent() {
    let base = || {
        W::default()
            .s("BlockStored")
            .arr(2)
            .u(7)
            .i(-1)
            .nil()
            .arr(2)
            .u(3)
            .u(4)
            .u(2)
    };
    // Oldest: up to block_size (SGLang 0.4) or lora_id (vLLM).
    let five = W::default().arr(5).raw(&base().done()).done();
    let six = W::default().arr(6).raw(&base().nil().done()).done();
    // Then medium, then lora_name, then extra_keys and more.
    let seven = W::default()
        .arr(7)
        .raw(&base().u(3).s("CPU_PINNED").done())
        .done();
    let nine = W::default()
        .arr(9)
        .raw(&base().nil().s("GPU").s("adapter").arr(1).nil().done())
        .done();
    // SGLang's BlockStoredWithMetadata: a {cache_salt} map at position 7.
    let salted = W::default()
        .arr(8)
        .raw(&base().nil().s("GPU").map(1).s("cache_salt").s("s").done())
        .done();
    let batch = decode(&[five, six, seven, nine, salted]).unwrap();
    let with = |medium: Option<&str>, lora: Option<&str>| Stored {
        hashes: vec![7, u64::MAX],
        parent: None,
        tokens: vec![3, 4],
        block_size: 2,
        lora_name: lora.map(Into::into),
        medium: medium.map(Into::into),
        ..Default::default()
    };
    assert_eq!(
        batch.events,
        [
            Event::Stored(with(None, None)),
            Event::Stored(with(None, None)),
            Event::Stored(with(Some("CPU_PINNED"), None)),
            Event::Stored(with(Some("GPU"), Some("adapter"))),
            Event::Stored(Stored {
                cache_salt: Some("s".into()),
                ..with(Some("GPU"), None)
            }),
        ]
    );
    let removed = tagged_array(1, "BlockRemoved").done();
    assert_eq!(why(decode(&[removed])), "event 0: block_hashes: missing");
    let removed = tagged_array(4, "BlockRemoved")
        .arr(1)
        .u(1)
        .s("DISK")
        .u(0)
        .done();
    let cleared = tagged_array(2, "AllBlocksCleared").map(0).done();
    assert_eq!(
        decode(&[removed, cleared]).unwrap().events,
        [
            Event::Removed(Removed {
                hashes: [1].into(),
                medium: Some("DISK".into()),
                group: Some(0),
            }),
            Event::Cleared
        ]
    );
}

#[test]
fn unknown_event_types_are_skipped_and_counted() {
    let unknown_map = tagged_map(2, "BlockPinned")
        .s("block_hashes")
        .arr(1)
        .raw(&[0x91, 0x91, 0xc0])
        .done();
    let unknown_array = tagged_array(3, "KvMetrics").u(1).map(0).done();
    let cleared = tagged_map(1, "AllBlocksCleared").done();
    let batch = decode(&[unknown_map, cleared, unknown_array]).unwrap();
    assert_eq!(batch.events, [Event::Cleared]);
    assert_eq!(batch.unknown_events, 2);
}

#[test]
fn long_arrays_read_in_the_first_pass_keep_the_last_key_and_its_error() {
    let payload = |first: &[u8], last: &[u8]| {
        W::default()
            .map(5)
            .s("token_ids")
            .raw(first)
            .s("type")
            .s("BlockStored")
            .s("block_hashes")
            .arr(1)
            .u(7)
            .s("block_size")
            .u(2)
            .s("token_ids")
            .raw(last)
            .done()
    };
    let ok = decode(&[payload(&[0xa1, b'x'], &[0x92, 1, 0xcd, 1, 0])]).unwrap();
    assert_eq!(ok.events, [stored(vec![7], None, vec![1, 256])]);
    assert_eq!(
        why(decode(&[payload(&[0x92, 1, 2], &[0xa1, b'x'])])),
        "event 0: token_ids: expected an array, found a string"
    );
}

#[test]
fn hashes_in_every_form() {
    let digest: Vec<u8> = (1..=32).collect();
    let e = tagged_array(3, "BlockRemoved")
        .arr(6)
        .u(0)
        .u(1 << 63)
        .i(-2)
        .i(i64::MIN)
        .bin(&digest)
        .bin(&digest[..8])
        .nil()
        .done();
    let want = [
        0,
        1 << 63,
        u64::MAX - 1,
        1 << 63,
        0x191a_1b1c_1d1e_1f20,
        0x0102_0304_0506_0708,
    ];
    assert_eq!(
        decode(&[e]).unwrap().events,
        [Event::Removed(Removed {
            hashes: want[..].into(),
            medium: None,
            group: None,
        })]
    );
}

#[test]
fn bad_fields_are_refused_with_where_and_what() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            tagged_array(2, "BlockRemoved").arr(1).bin(&[1; 4]).done(),
            "event 1: block_hashes[0]: hash of 4 bytes (at least 8 needed)",
        ),
        (
            tagged_array(2, "BlockRemoved").arr(1).s("x").done(),
            "event 1: block_hashes[0]: expected an integer or bytes, found a string",
        ),
        (
            tagged_map(4, "BlockStored")
                .s("block_hashes")
                .arr(0)
                .s("token_ids")
                .s("oops")
                .s("block_size")
                .u(1)
                .done(),
            "event 1: token_ids: expected an array, found a string",
        ),
        (
            orphan_array_store(5).arr(2).u(1).u(1 << 32).u(1).done(),
            "event 1: token_ids[1]: 4294967296 does not fit in a u32",
        ),
        (
            orphan_array_store(5).arr(1).i(-1).u(1).done(),
            "event 1: token_ids[0]: -1 does not fit in a u32",
        ),
        (
            // A pair (SGLang's EAGLE pages) must have a token first.
            orphan_array_store(5).arr(1).arr(0).u(1).done(),
            "event 1: token_ids[0]: an empty array where a token id (or a pair) belongs",
        ),
        (
            orphan_array_store(4).arr(0).done(),
            "event 1: block_size: missing",
        ),
        (
            W::default().map(1).s("block_hashes").arr(0).done(),
            "event 1: type: missing",
        ),
        (
            W::default().map(1).s("type").u(1).done(),
            "event 1: type: expected a string, found an integer",
        ),
        (
            W::default()
                .map(1)
                .s("extra_keys")
                .raw(&[0x93, 0xc0])
                .done(),
            "event 1: extra_keys: the payload ends inside this value",
        ),
        (
            W::default().map(1).s("mystery").raw(&[0x93, 0xc0]).done(),
            "event 1: (unknown field): the payload ends inside this value",
        ),
        (
            W::default().map(1).raw(&[0xa2, 0xc3, 0x28]).u(1).done(),
            "event 1: map key: the string is not valid UTF-8",
        ),
        (W::default().arr(0).done(), "event 1: type: missing"),
        (
            W::default().s("BlockStored").done(),
            "event 1: expected a map or an array, found a string",
        ),
        (
            W::default().arr(1).raw(&[0xa1, 0xff]).done(),
            "event 1: type: the string is not valid UTF-8",
        ),
        (
            tagged_array(3, "BlockRemoved")
                .arr(0)
                .raw(&[0xa1, 0xff])
                .done(),
            "event 1: medium: the string is not valid UTF-8",
        ),
        (
            orphan_array_store(8).arr(0).u(1).nil().nil().u(3).done(),
            "event 1: lora_name: expected a string, nil or a map, found an integer",
        ),
    ];
    let cleared = tagged_array(1, "AllBlocksCleared").done();
    for (event, want) in cases {
        let got = why(decode(&[cleared.clone(), event]));
        assert_eq!(got, want);
    }
}

#[test]
fn a_malformed_event_is_skipped_alone_while_its_framing_holds() {
    let cleared = tagged_array(1, "AllBlocksCleared").done();
    let removed = |medium: W| {
        tagged_map(3, "BlockRemoved")
            .s("block_hashes")
            .arr(1)
            .u(9)
            .s("medium")
            .raw(&medium.done())
            .done()
    };
    // A medium of the wrong type, and a hash too short: both framed.
    let bad_medium = removed(W::default().u(3));
    let short_hash = tagged_array(2, "BlockRemoved").arr(1).bin(&[1; 4]).done();
    let good = removed(W::default().s("GPU"));
    let batch = decode(&[
        bad_medium.clone(),
        cleared.clone(),
        short_hash,
        good.clone(),
    ])
    .unwrap();
    let want = Event::Removed(Removed {
        hashes: [9].into(),
        medium: Some("GPU".into()),
        group: None,
    });
    assert_eq!(batch.events, [Event::Cleared, want]);
    let bad = batch.bad.unwrap();
    assert_eq!(bad.count, 2);
    assert_eq!(
        bad.first.to_string(),
        "event 0: medium: expected a string, found an integer"
    );
    assert_eq!(decode(&[cleared.clone(), good.clone()]).unwrap().bad, None);
    // An event that claims more than the payload holds cannot be
    // stepped over, and the batch is refused.
    let cut = tagged_array(2, "BlockRemoved").raw(&[0x93, 1]).done();
    let got = decode(&[cleared, good, cut]);
    assert!(matches!(got, Err(DecodeError::Truncated { .. })), "{got:?}");
}

#[test]
fn list_limits_name_the_limit() {
    let limits = DecodeLimits {
        max_events: 2,
        max_hashes: 1,
        max_tokens: 3,
    };
    let run = |events: &[Vec<u8>]| decode_batch(&batch_of(events), &limits);
    let hashes = tagged_array(2, "BlockRemoved").arr(2).u(1).u(2).done();
    assert_eq!(
        why(run(&[hashes])),
        "event 0: block_hashes: 2 elements, more than max_hashes (1)"
    );
    let tokens = orphan_array_store(5).arr(4).raw(&[1, 2, 3, 4]).u(1).done();
    assert_eq!(
        why(run(&[tokens])),
        "event 0: token_ids: 4 elements, more than max_tokens (3)"
    );
    let cleared = tagged_array(1, "AllBlocksCleared").done();
    assert_eq!(
        why(run(&[cleared.clone(), cleared.clone(), cleared])),
        "batch: events: 3 elements, more than max_events (2)"
    );
}

#[test]
fn the_shortest_decodable_event_is_min_event_bytes_long() {
    let removed = tagged_array(2, "BlockRemoved").arr(0).done();
    let stored = orphan_array_store(5).arr(0).u(0).done();
    let cleared = tagged_array(1, "AllBlocksCleared").done();
    assert_eq!(removed.len(), MIN_EVENT_BYTES);
    assert!(stored.len() >= MIN_EVENT_BYTES);
    assert!(cleared.len() >= MIN_EVENT_BYTES);
}

#[test]
fn eagle_pairs_read_as_their_first_token_between_runs_of_ints() {
    // SGLang with EAGLE: a page's token is a (token, next_token) pair.
    // Wide ints around them, so that each run after a pair is read
    // eight bytes at a time.
    let b = tagged_array(5, "BlockStored")
        .arr(1)
        .u(9)
        .nil()
        .arr(9)
        .u(70_000)
        .arr(2)
        .u(11)
        .u(12)
        .u(70_001)
        .u(70_002)
        .u(70_003)
        .arr(2)
        .u(13)
        .u(14)
        .u(300)
        .u(5)
        .u(200)
        .u(9)
        .done();
    let batch = decode_batch(&batch_of(&[b]), &DecodeLimits::default()).unwrap();
    match &batch.events[..] {
        [Event::Stored(s)] => assert_eq!(
            s.tokens,
            [70_000, 11, 70_001, 70_002, 70_003, 13, 300, 5, 200]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_error_stepping_over_a_field_names_it() {
    for field in [
        "type",
        "parent_block_hash",
        "block_size",
        "lora_name",
        "medium",
        "extra_keys",
    ] {
        let b = W::default().map(1).s(field).raw(&[0x93, 0xc0]).done();
        let err = why(decode_batch(&batch_of(&[b]), &DecodeLimits::default()));
        assert_eq!(
            err,
            format!("event 0: {field}: the payload ends inside this value")
        );
    }
}

/// vLLM's `extra_keys` (LoRA name, item pairs, salt, digest, untagged),
/// SGLang's `cache_salt` and vLLM's `lookahead_token_ids`, in the map form
/// and at their positions in the array form.
#[test]
fn identity_fields_in_both_forms() {
    let keys = |w: W| {
        w.arr(3)
            .nil()
            .arr(5)
            .s("sql-lora")
            .arr(2)
            .s("img-a")
            .i(-16)
            .s("tenant")
            .bin(&[9; 4])
            .arr(2)
            .u(1)
            .u(2)
            .nil()
    };
    let map = keys(
        tagged_map(8, "BlockStored")
            .s("block_hashes")
            .arr(3)
            .u(1)
            .u(2)
            .u(3)
            .s("token_ids")
            .arr(3)
            .u(5)
            .u(6)
            .u(7)
            .s("block_size")
            .u(1)
            .s("cache_salt")
            .s("sg")
            .s("lookahead_token_ids")
            .arr(1)
            .arr(0)
            .s("parent_block_hash")
            .nil()
            .s("extra_keys"),
    )
    .done();
    let array = keys(
        tagged_array(16, "BlockStored")
            .arr(3)
            .u(1)
            .u(2)
            .u(3)
            .nil()
            .arr(3)
            .u(5)
            .u(6)
            .u(7)
            .u(1)
            .nil()
            .s("GPU")
            .s("sql-lora"),
    )
    .u(0)
    .s("full_attention")
    .nil()
    .nil()
    .nil()
    .nil()
    .arr(1)
    .arr(0)
    .done();
    let batch = decode(&[map, array]).unwrap();
    let extra = vec![
        None,
        Some(
            vec![
                RawExtraKey::Text("sql-lora".into()),
                RawExtraKey::Mm {
                    identifier: b"img-a".to_vec().into(),
                    offset: -16,
                },
                RawExtraKey::Text("tenant".into()),
                RawExtraKey::Bytes(vec![9; 4].into()),
                RawExtraKey::Unknown,
            ]
            .into_boxed_slice(),
        ),
        None,
    ];
    let expect = Stored {
        hashes: vec![1, 2, 3],
        tokens: vec![5, 6, 7],
        block_size: 1,
        extra_keys: extra,
        lookahead: true,
        ..Default::default()
    };
    assert_eq!(
        batch.events,
        [
            Event::Stored(Stored {
                cache_salt: Some("sg".into()),
                ..expect.clone()
            }),
            Event::Stored(Stored {
                medium: Some("GPU".into()),
                lora_name: Some("sql-lora".into()),
                group: Some(0),
                group_kind: Some("full_attention".into()),
                ..expect
            }),
        ]
    );
    // Nil for every block (plain text) is no keys at all.
    let plain = tagged_map(5, "BlockStored")
        .s("block_hashes")
        .arr(1)
        .u(1)
        .s("token_ids")
        .arr(1)
        .u(5)
        .s("block_size")
        .u(1)
        .s("extra_keys")
        .arr(1)
        .nil()
        .done();
    match &decode(&[plain]).unwrap().events[0] {
        Event::Stored(s) => assert!(s.extra_keys.is_empty() && !s.lookahead),
        e => panic!("{e:?}"),
    }
}

#[test]
fn extra_keys_past_max_hashes_are_refused() {
    let e = empty_store(5, 1)
        .s("extra_keys")
        .arr(3)
        .nil()
        .nil()
        .nil()
        .done();
    let limits = DecodeLimits {
        max_hashes: 2,
        ..DecodeLimits::default()
    };
    let got = decode_batch(&batch_of(&[e]), &limits);
    assert!(why(got).contains("max_hashes"));
}
