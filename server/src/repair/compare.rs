//! What a round of repair compares, without I/O: the window both sides
//! digest, which groups and cells differ, and which items the peer holds
//! that this server lacks.

use std::time::Duration;

use prefix_index::digest::Window;
use prefix_proto::message::cell_of;

/// How recent an entry may be and still be left out of the digests: a
/// gateway's write reaches the replicas of a set some milliseconds apart,
/// and a round's questions are answered some milliseconds apart, so the
/// newest entries would differ in every round. They are compared once
/// this old. Two seconds: well past a write's spread (its retries
/// included), and inside the ten seconds in which replicas agree after
/// the writes stop.
pub const SETTLE: Duration = Duration::from_secs(2);

/// How near its TTL an entry may be and still count: one a replica
/// expires a moment before another would differ for that moment. Twice
/// [`SETTLE`].
pub const EXPIRY_GUARD: Duration = Duration::from_secs(4);

/// The window a round at `now` compares, for an index whose entries live
/// `ttl`: entries written from `ttl - EXPIRY_GUARD` to [`SETTLE`] ago.
/// `None` when the TTL leaves no such time (6 s or less: repair then
/// compares nothing).
pub fn window(now: u64, ttl: Duration) -> Option<Window> {
    let high = now.checked_sub(SETTLE.as_millis() as u64)?;
    let low = now
        .saturating_sub(ttl.as_millis() as u64)
        .saturating_add(EXPIRY_GUARD.as_millis() as u64);
    (low < high).then_some(Window { low, high, now })
}

/// The positions at which two lists of digests differ (a list too short
/// counts as zeros there).
pub fn differing(mine: &[u64], theirs: &[u64]) -> Vec<u64> {
    let n = mine.len().max(theirs.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..n)
        .filter(|&i| at(mine, i) != at(theirs, i))
        .map(|i| i as u64)
        .collect()
}

/// The items of `theirs` that `mine` lacks; both ascending.
pub fn wanted(theirs: &[u64], mine: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut j = 0;
    for &t in theirs {
        while j < mine.len() && mine[j] < t {
            j += 1;
        }
        if mine.get(j) != Some(&t) {
            out.push(t);
        }
    }
    out
}

/// The cells of `asked` a peer's items answer covers: all of them, or
/// when it stopped early (`more`), those up to its last item's cell.
pub fn covered(asked: &[u64], items: &[u64], more: bool) -> Vec<u64> {
    match (more, items.last()) {
        (false, _) => asked.to_vec(),
        (true, None) => Vec::new(),
        (true, Some(&last)) => {
            let last = cell_of(last) as u64;
            asked.iter().copied().filter(|&c| c <= last).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_leaves_out_the_newest_and_the_nearly_expired() {
        let w = window(100_000, Duration::from_secs(60)).unwrap();
        assert_eq!((w.low, w.high, w.now), (44_000, 98_000, 100_000));
        assert_eq!(window(1_000, Duration::from_secs(60)), None, "too early");
        let short = Duration::from_secs(6);
        assert_eq!(window(100_000, short), None, "a TTL too short");
    }

    #[test]
    fn digests_differ_where_their_values_do() {
        assert_eq!(differing(&[1, 2, 3], &[1, 5, 3]), [1]);
        assert_eq!(differing(&[1, 0], &[1]), Vec::<u64>::new());
        assert_eq!(differing(&[], &[0, 7]), [1]);
    }

    #[test]
    fn wanted_items_are_the_peers_this_server_lacks() {
        assert_eq!(wanted(&[1, 3, 5, 9], &[2, 3, 9, 10]), [1, 5]);
        assert_eq!(wanted(&[], &[1]), Vec::<u64>::new());
        assert_eq!(wanted(&[4], &[]), [4]);
    }

    #[test]
    fn a_cut_answer_covers_the_cells_up_to_its_last_item() {
        let item_in = |cell: u64| (cell << 52) | 1;
        let asked = [1, 5, 9];
        assert_eq!(covered(&asked, &[item_in(1)], false), asked);
        assert_eq!(covered(&asked, &[item_in(1), item_in(5)], true), [1, 5]);
        assert_eq!(covered(&asked, &[], true), Vec::<u64>::new());
    }
}
