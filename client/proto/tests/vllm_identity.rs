//! Our identity rule against vLLM's: `testdata/vllm_extra_keys.json` holds
//! the extra keys vLLM 0.33.0's own `generate_block_hash_extra_keys` gives
//! each block of a set of requests (salted, multimodal in every placement,
//! LoRA, prompt embeddings; `testdata/gen_vllm_identity.py` made it from the
//! wheel). For every block, the seed a gateway builds from the request
//! ([`Identity::block_seeds`]) must be the seed of vLLM's keys, LoRA left
//! out (an adapter is a model namespace).

use prefix_proto::key::{identity_seed, ExtraKey};
use prefix_testkit::vllm::{cases, hex};
use serde_json::Value;

/// The bytes a tagged key's value holds, kept alive for the borrow.
enum Owned {
    Mm(String, i64),
    Salt(String),
    Embeds(Vec<u8>),
}

fn owned(key: &Value) -> Option<Owned> {
    let k = key.as_array().unwrap();
    match k[0].as_str().unwrap() {
        "lora" => None,
        "mm" => Some(Owned::Mm(
            k[1].as_str().unwrap().into(),
            k[2].as_i64().unwrap(),
        )),
        "cache_salt" => Some(Owned::Salt(k[1].as_str().unwrap().into())),
        "prompt_embeds" => Some(Owned::Embeds(hex(k[1]["hex"].as_str().unwrap()))),
        other => panic!("a key vLLM does not make: {other}"),
    }
}

fn seed_of(keys: &[Owned]) -> u64 {
    identity_seed(keys.iter().map(|k| match k {
        Owned::Mm(id, offset) => ExtraKey::Mm {
            identifier: id.as_bytes(),
            offset: *offset,
        },
        Owned::Salt(s) => ExtraKey::CacheSalt(s.as_bytes()),
        Owned::Embeds(d) => ExtraKey::PromptEmbeds(d),
    }))
}

#[test]
fn every_block_seed_agrees_with_vllms_extra_keys() {
    let cases = cases();
    assert!(cases.len() >= 14);
    let mut identity_blocks = 0;
    for case in cases {
        let blocks = case.blocks();
        assert_eq!(case.hash_keys.len(), blocks, "{}", case.name);
        let ours = case.identity().block_seeds(blocks, case.block_size);
        let theirs: Vec<u64> = case
            .hash_keys
            .iter()
            .map(|keys| {
                let keys: Vec<Owned> = keys.iter().flatten().filter_map(owned).collect();
                seed_of(&keys)
            })
            .collect();
        assert_eq!(ours, theirs, "{}", case.name);
        identity_blocks += theirs.iter().filter(|&&s| s != 0).count();
    }
    // The vectors exercise the rule, not only plain blocks.
    assert!(identity_blocks >= 30, "{identity_blocks}");
}
