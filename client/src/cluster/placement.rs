//! Where each model lives: rendezvous (highest-random-weight) hashing of
//! its name over the servers' names.

use xxhash_rust::xxh3::xxh3_64;

/// The replica set of `model` among `names`: the indexes of the `r`
/// servers ranked highest by rendezvous hashing, highest first. Empty if
/// there are no servers; all of them if `r` is larger.
pub fn replicas(model: &str, names: &[impl AsRef<str>], r: usize) -> Vec<usize> {
    let mut buf = Vec::with_capacity(300);
    let mut ranked: Vec<(u64, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            buf.clear();
            buf.extend_from_slice(name.as_ref().as_bytes());
            buf.push(0);
            buf.extend_from_slice(model.as_bytes());
            (xxh3_64(&buf), i)
        })
        .collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    ranked.into_iter().take(r).map(|(_, i)| i).collect()
}

/// The index of the server `model` belongs to among `names` (its first
/// replica). `None` if there are no servers.
pub fn place(model: &str, names: &[impl AsRef<str>]) -> Option<usize> {
    replicas(model, names, 1).first().copied()
}
