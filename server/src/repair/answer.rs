//! A peer's questions about this server's digests ([`Op::Digest`]),
//! answered from the index and the removals kept.
//!
//! [`Op::Digest`]: prefix_proto::Op::Digest

use std::collections::HashSet;

use prefix_index::digest::Window;
use prefix_index::{Index, Reader};
use prefix_proto::message::{groups, CELLS, CELLS_PER_GROUP, GROUPS, MAX_DIGEST_ANSWER};
use prefix_proto::{
    DigestAnswer, DigestAsk, DigestEntry, DigestLevel, ErrorCode, Eviction, ModelDigest, Reply,
    Tombstone,
};

use crate::replica::removals::Removals;

/// The answer to `ask` at `now`, from `index` as `reader` sees it: one
/// walk of the model's tree (of every model's, at level `models`). A
/// group or cell out of range is refused as malformed.
pub fn answer(
    index: &Index,
    reader: &Reader<'_>,
    removals: &Removals,
    ask: &DigestAsk,
    now: u64,
) -> Reply {
    // Only the first level needs the sweep's word (it waits for a sweep
    // call under way).
    let evicted = match ask.level {
        DigestLevel::Models => index.evicted(),
        _ => Default::default(),
    };
    let w = Window {
        low: ask.low,
        high: ask.high,
        now,
    };
    let mut out = DigestAnswer::default();
    match ask.level {
        DigestLevel::Models => {
            for model in reader.model_names() {
                let Some(cells) = reader.digest_cells(model, w) else {
                    continue;
                };
                let groups = groups(&cells);
                if groups.iter().any(|&g| g != 0) {
                    out.models.push(ModelDigest {
                        model: model.into(),
                        groups,
                    });
                }
            }
            out.removals = removals
                .recent()
                .into_iter()
                .map(|(pod, at)| Tombstone { pod, at })
                .collect();
            let (per_pod, global) = evicted;
            let every = global.map(|t| (String::new(), t));
            out.evictions = per_pod
                .into_iter()
                .chain(every)
                .map(|(pod, t)| Eviction {
                    pod,
                    through: t.time,
                    depth: t.depth,
                })
                .collect();
        }
        DigestLevel::Cells => {
            // Each group's cells at most once: the answer stays within
            // one model's cells.
            if ask.of.len() > GROUPS {
                return ErrorCode::Malformed.reply(format!(
                    "digest: {} groups asked, of {GROUPS}",
                    ask.of.len()
                ));
            }
            if let Some(bad) = ask.of.iter().find(|&&g| g >= GROUPS as u64) {
                return ErrorCode::Malformed
                    .reply(format!("digest: group {bad} is not one of the {GROUPS}"));
            }
            let cells = reader
                .digest_cells(&ask.model, w)
                .unwrap_or_else(|| vec![0; CELLS]);
            for &g in &ask.of {
                let g = g as usize * CELLS_PER_GROUP;
                out.values.extend_from_slice(&cells[g..g + CELLS_PER_GROUP]);
            }
        }
        DigestLevel::Items => {
            let mut asked = vec![false; CELLS];
            for &c in &ask.of {
                match asked.get_mut(c as usize) {
                    Some(a) => *a = true,
                    None => {
                        return ErrorCode::Malformed
                            .reply(format!("digest: cell {c} is not one of the {CELLS}"))
                    }
                }
            }
            (out.values, out.more) = reader.digest_items(&ask.model, w, &asked, MAX_DIGEST_ANSWER);
        }
        DigestLevel::Entries => {
            let wanted: HashSet<u64> = ask.of.iter().copied().collect();
            let (found, more) = reader.digest_entries(&ask.model, w, &wanted, MAX_DIGEST_ANSWER);
            out.entries = found
                .into_iter()
                .map(|f| DigestEntry {
                    pod: f.pod.into(),
                    key: f.key,
                    at: f.at,
                })
                .collect();
            out.more = more;
        }
    }
    Reply::Digest(Box::new(out))
}
