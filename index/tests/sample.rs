//! Sampling the keys an index holds: every sampled key is a whole key some
//! pod was given (its path to a leaf), found whole by a lookup, and samples
//! cover the models.

use std::collections::HashSet;

use prefix_index::{Index, IndexConfig};

const NOW: u64 = 1_700_000_000_000;

#[test]
fn sampled_keys_are_held_keys_and_cover_the_models() {
    let index = Index::new(IndexConfig::default());
    assert!(index.reader().sample_keys(10, 1).is_empty());
    let mut held = HashSet::new();
    for m in 0..4u64 {
        for k in 0..300u64 {
            // A shared 3-block prefix per model, then 1 to 5 blocks of the
            // key's own: keys end at leaves (none is a prefix of another).
            let mut key = vec![m, m + 10, m + 20];
            key.extend((0..1 + k % 5).map(|b| m << 40 | k << 8 | b));
            index.insert(&format!("m{m}"), &key, "p", NOW).unwrap();
            held.insert((format!("m{m}"), key));
        }
    }
    let reader = index.reader();
    let sample = reader.sample_keys(400, 7);
    assert_eq!(sample.len(), 400);
    let mut models = HashSet::new();
    let mut distinct = HashSet::new();
    for (model, key) in &sample {
        assert!(
            held.contains(&(model.to_string(), key.clone())),
            "{model} {key:?}"
        );
        let found = reader.lookup(model, key, None, NOW);
        assert_eq!(found.matches[0].blocks as usize, key.len());
        models.insert(*model);
        distinct.insert((*model, key.clone()));
    }
    assert_eq!(models.len(), 4);
    assert!(distinct.len() > 200, "{} distinct of 400", distinct.len());
    // The seed decides.
    assert_eq!(reader.sample_keys(50, 7), sample[..50]);
    assert_ne!(reader.sample_keys(50, 8), sample[..50]);
}
