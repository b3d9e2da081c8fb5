use prefix_testkit::vllm::{cases, hex};
use serde_json::Value;

use super::*;

fn raw(key: &Value) -> RawExtraKey {
    match key {
        Value::String(s) => RawExtraKey::Text(s.as_str().into()),
        Value::Array(pair) => RawExtraKey::Mm {
            identifier: pair[0].as_str().unwrap().as_bytes().into(),
            offset: pair[1].as_i64().unwrap(),
        },
        Value::Object(o) => RawExtraKey::Bytes(hex(o["hex"].as_str().unwrap()).into()),
        other => panic!("vLLM publishes no such key: {other}"),
    }
}

fn store(hashes: usize) -> Stored {
    Stored {
        hashes: (1..=hashes as u64).collect(),
        block_size: 16,
        ..Stored::default()
    }
}

/// The seeds a store's event gives, each of the store's blocks (0 for a
/// plain one).
fn seeds_of(s: &Stored, ratio: Ratio) -> (Vec<u64>, Identified) {
    let mut seeds = vec![7];
    let found = store_seeds(s, ratio, &mut seeds);
    if seeds.is_empty() {
        seeds = vec![0; s.hashes.len() * ratio.seeds_per_block()];
    }
    (seeds, found)
}

/// vLLM's published keys (`client/proto/testdata/vllm_extra_keys.json`,
/// from vLLM 0.33.0's own functions) fold into the seeds a gateway builds
/// from the same request, block by block: the server's side and the
/// gateways' side of the rule agree on every shape vLLM sends.
#[test]
fn vllm_event_keys_fold_into_the_gateways_seeds() {
    let mut checked = 0;
    for case in cases() {
        let blocks = case.blocks();
        let gateway = case.identity().block_seeds(blocks, case.block_size);
        let event = Stored {
            lora_name: case.lora.as_ref().map(|l| l.name.as_str().into()),
            extra_keys: case
                .event_keys
                .iter()
                .map(|b| b.as_ref().map(|keys| keys.iter().map(raw).collect()))
                .collect(),
            ..store(blocks)
        };
        let (ours, found) = seeds_of(&event, Ratio::Whole(1));
        assert_eq!(ours, gateway, "{}", case.name);
        assert_eq!(found.untold, 0, "{}", case.name);
        checked += gateway.iter().filter(|&&s| s != 0).count();
    }
    assert!(checked >= 30, "{checked}");
}

#[test]
fn a_plain_store_has_no_seeds() {
    let mut seeds = vec![1, 2];
    let plain = Stored {
        lora_name: Some("a".into()),
        extra_keys: vec![None, Some(vec![RawExtraKey::Text("a".into())].into())],
        ..store(2)
    };
    // The adapter's name alone is the model namespace, not an identity.
    assert_eq!(
        store_seeds(&plain, Ratio::Whole(1), &mut seeds),
        Identified::default()
    );
    assert!(seeds.is_empty());
}

#[test]
fn sglang_salts_enter_a_sequences_first_block() {
    let salt = identity_seed([ExtraKey::CacheSalt(b"t")]);
    let first = Stored {
        cache_salt: Some("t".into()),
        ..store(3)
    };
    let (seeds, found) = seeds_of(&first, Ratio::Whole(1));
    assert_eq!(seeds, [salt, 0, 0]);
    assert_eq!(found.blocks, 1);
    // Pages (SGLang's one-token pages): the first page carries it, and its
    // group takes it.
    assert_eq!(seeds_of(&first, Ratio::Pages(16)).0, [salt, 0, 0]);
    // A later store of the same sequence: its path already has the salt.
    let later = Stored {
        parent: Some(9),
        ..first
    };
    assert_eq!(seeds_of(&later, Ratio::Whole(1)).0, [0, 0, 0]);
}

#[test]
fn engine_blocks_of_several_of_ours_keep_salts_and_never_match_items() {
    let salt = identity_seed([ExtraKey::CacheSalt(b"t")]);
    let untold = unmatched_seed();
    let s = Stored {
        extra_keys: vec![
            Some(vec![RawExtraKey::Text("t".into())].into()),
            Some(
                vec![RawExtraKey::Mm {
                    identifier: b"img".to_vec().into(),
                    offset: 4,
                }]
                .into(),
            ),
            None,
        ],
        ..store(3)
    };
    let (seeds, found) = seeds_of(&s, Ratio::Whole(2));
    assert_eq!(seeds, [salt, 0, untold, untold, 0, 0]);
    assert_eq!(
        found,
        Identified {
            blocks: 2,
            untold: 1
        }
    );
    // Pages: an item on a page cannot be placed in our block either.
    let (pages, _) = seeds_of(&s, Ratio::Pages(4));
    assert_eq!(pages, [salt, untold, 0]);
}

#[test]
fn unknown_keys_and_lookahead_make_blocks_match_nothing() {
    let untold = unmatched_seed();
    let odd = Stored {
        extra_keys: vec![None, Some(vec![RawExtraKey::Unknown].into())],
        ..store(2)
    };
    let (seeds, found) = seeds_of(&odd, Ratio::Whole(1));
    assert_eq!(seeds, [0, untold]);
    assert_eq!(found.untold, 1);
    let ahead = Stored {
        lookahead: true,
        ..store(2)
    };
    let (seeds, found) = seeds_of(&ahead, Ratio::Whole(1));
    assert_eq!(seeds, [untold, untold]);
    assert_eq!(found.untold, 2);
}
