//! A bridge's batch checked, then applied to its worker's block sets: one
//! set per tier and component kind, so that a report's per-hash component
//! mask, a revocation and a clear at one tier each touch what they name.
//!
//! Set `4 × (tier − 1) + c` holds the hashes reported at `tier` as whole
//! blocks (`c` 0: an empty or zero mask, the legacy form), or with
//! component `c` of FULL (1), SWA (2), MAMBA (3). A report replaces what
//! its hash was at the tier (it is the worker's view of the block there);
//! a revocation takes it from every set of the tier; a clear empties them.

use prefix_index::{Index, InsertError, PodError, SetError};
use tonic::Status;

use super::hits::Hits;
use super::pb::{ApplyExternalKvBatchRequest, ExternalKvActionType, TierType};
use super::SET_MODEL;

/// Sets per tier: whole blocks, then one per component.
pub const PER_TIER: u32 = 4;

/// The set of `tier`'s component `c` (0: whole blocks).
pub fn set_of(tier: i32, c: u32) -> u32 {
    (tier as u32 - 1) * PER_TIER + c
}

/// The tier and component of a set.
pub fn tier_of(set: u32) -> (i32, u32) {
    ((set / PER_TIER) as i32 + 1, set % PER_TIER)
}

/// The component bit (FULL 1, SWA 2, MAMBA 4) of component `c`.
pub fn bit(c: u32) -> u32 {
    1 << (c - 1)
}

/// What one batch may hold.
pub struct Limits {
    /// Most actions (`--max-batch`).
    pub actions: usize,
    /// Most hashes over all actions (`--max-key-blocks`).
    pub hashes: usize,
    /// Longest worker id (`--max-name-len`); an address may be four times it.
    pub name: usize,
}

/// Checks a batch before any of it is applied, in the order SGLang's
/// reference server does, with its statuses.
pub fn check(batch: &ApplyExternalKvBatchRequest, limits: &Limits) -> Result<(), Status> {
    if batch.worker_id.is_empty() {
        return Err(Status::invalid_argument("worker_id must not be empty"));
    }
    if batch.worker_id.len() > limits.name || batch.worker_id.contains('\0') {
        return Err(Status::invalid_argument(format!(
            "worker_id must be at most {} bytes, without NUL",
            limits.name
        )));
    }
    if batch.worker_address.len() > limits.name.saturating_mul(4) {
        return Err(Status::invalid_argument(format!(
            "worker_address must be at most {} bytes",
            limits.name.saturating_mul(4)
        )));
    }
    if batch.actions.len() > limits.actions {
        return Err(Status::resource_exhausted(format!(
            "batch contains {} actions; maximum is {} (--max-batch)",
            batch.actions.len(),
            limits.actions
        )));
    }
    let hashes: usize = batch.actions.iter().map(|a| a.hashes.len()).sum();
    if hashes > limits.hashes {
        return Err(Status::resource_exhausted(format!(
            "batch contains {hashes} hashes; maximum is {} (--max-key-blocks)",
            limits.hashes
        )));
    }
    for a in &batch.actions {
        match TierType::try_from(a.tier) {
            Ok(TierType::TierUnknown) => {
                return Err(Status::invalid_argument("tier must not be TIER_UNKNOWN"))
            }
            Ok(_) => {}
            Err(_) => return Err(Status::invalid_argument("tier is not supported")),
        }
        match ExternalKvActionType::try_from(a.r#type) {
            Ok(ExternalKvActionType::ActionReport | ExternalKvActionType::ActionRevoke) => {
                if a.hashes.is_empty() {
                    return Err(Status::invalid_argument("hashes must not be empty"));
                }
            }
            Ok(ExternalKvActionType::ActionClearAllAtTier) => {}
            _ => return Err(Status::invalid_argument("action type is not supported")),
        }
        for (field, len) in [
            ("component_masks", a.component_masks.len()),
            ("block_sizes", a.block_sizes.len()),
        ] {
            if len != 0 && len != a.hashes.len() {
                return Err(Status::invalid_argument(format!(
                    "{field} has {len} entries but must be empty or match {} hashes",
                    a.hashes.len()
                )));
            }
        }
    }
    Ok(())
}

/// Checks a query's hashes: some, and at most `max` (`--max-key-blocks`).
pub fn check_query(hashes: &[i64], max: usize) -> Result<(), Status> {
    if hashes.is_empty() {
        return Err(Status::invalid_argument("hashes must not be empty"));
    }
    if hashes.len() > max {
        return Err(Status::resource_exhausted(format!(
            "request contains {} hashes; maximum is {max} (--max-key-blocks)",
            hashes.len()
        )));
    }
    Ok(())
}

/// The status of an index refusal.
fn status(e: SetError) -> Status {
    match e {
        SetError::Insert(InsertError::Pod(PodError::BadName { .. } | PodError::Reserved)) => {
            Status::invalid_argument(e.to_string())
        }
        // The index or its pod table is full: the bridge tries again later,
        // the router falls back meanwhile.
        _ => Status::resource_exhausted(e.to_string()),
    }
}

/// Applies a checked batch's actions to its worker's sets, in order.
pub fn apply(
    index: &Index,
    batch: &ApplyExternalKvBatchRequest,
    hits: &Hits,
) -> Result<(), Status> {
    let worker = batch.worker_id.as_str();
    for a in &batch.actions {
        let tier = a.tier;
        let hashes: Vec<u64> = a.hashes.iter().map(|&h| h as u64).collect();
        match ExternalKvActionType::try_from(a.r#type) {
            Ok(ExternalKvActionType::ActionReport) if a.component_masks.iter().all(|&m| m == 0) => {
                // Whole blocks: one set holds them, the others do not.
                index
                    .set_hold(SET_MODEL, worker, set_of(tier, 0), &hashes)
                    .map_err(status)?;
                for c in 1..PER_TIER {
                    index.set_release(SET_MODEL, worker, set_of(tier, c), &hashes);
                }
            }
            Ok(ExternalKvActionType::ActionReport) => {
                // Hash by hash: the last report of a hash is its state.
                for (&h, &mask) in hashes.iter().zip(&a.component_masks) {
                    let one = [h];
                    for c in 0..PER_TIER {
                        let wanted = match c {
                            0 => mask == 0,
                            c => mask & bit(c) != 0,
                        };
                        let set = set_of(tier, c);
                        if wanted {
                            index
                                .set_hold(SET_MODEL, worker, set, &one)
                                .map_err(status)?;
                        } else {
                            index.set_release(SET_MODEL, worker, set, &one);
                        }
                    }
                }
            }
            Ok(ExternalKvActionType::ActionRevoke) => {
                for c in 0..PER_TIER {
                    index.set_release(SET_MODEL, worker, set_of(tier, c), &hashes);
                }
                hits.forget_unheld(index, &a.hashes);
            }
            Ok(ExternalKvActionType::ActionClearAllAtTier) => {
                for c in 0..PER_TIER {
                    index.set_clear(worker, set_of(tier, c));
                }
            }
            // Refused by `check`.
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tier_and_component_has_a_set_of_its_own() {
        let mut seen = std::collections::HashSet::new();
        for tier in 1..=3 {
            for c in 0..PER_TIER {
                let s = set_of(tier, c);
                assert!(s < prefix_index::MAX_SETS);
                assert_eq!(tier_of(s), (tier, c));
                assert!(seen.insert(s));
            }
        }
        assert_eq!((bit(1), bit(2), bit(3)), (1, 2, 4));
    }

    use super::super::pb::{ExternalKvAction, MatchExternalKvPrefixRequest};
    use super::super::prefix::match_prefix;
    use super::super::workers::Workers;
    use proptest::prelude::*;

    fn any_action() -> impl Strategy<Value = ExternalKvAction> {
        (
            0..6_i32,
            0..6_i32,
            prop::collection::vec(-3..3_i64, 0..8),
            prop::collection::vec(0..9_u32, 0..3),
            prop::collection::vec(0..70_u32, 0..3),
        )
            .prop_map(|(kind, tier, hashes, component_masks, block_sizes)| {
                ExternalKvAction {
                    r#type: kind,
                    tier,
                    hashes,
                    component_masks,
                    block_sizes,
                }
            })
    }

    proptest! {
        /// Whatever a bridge sends, checked then applied, refuses with a
        /// status or applies, never panics; and the router's queries over
        /// what was applied answer (the index's own checks hold after).
        #[test]
        fn any_batch_applies_or_is_refused_and_queries_answer(
            batches in prop::collection::vec(
                (0..3_usize, 0..4_u64, prop::collection::vec(any_action(), 0..6)),
                1..8,
            ),
            query in prop::collection::vec(-3..3_i64, 0..8),
            max_blocks in 0..4_u32,
        ) {
            let index = Index::new(prefix_index::IndexConfig::default());
            let (hits, workers) = (Hits::default(), Workers::default());
            let limits = Limits { actions: 4, hashes: 12, name: 8 };
            for (w, seq, actions) in batches {
                let batch = ApplyExternalKvBatchRequest {
                    worker_id: ["", "w0", "w1"][w].into(),
                    seq,
                    actions,
                    worker_address: "http://w".into(),
                    ..Default::default()
                };
                if check(&batch, &limits).is_ok() {
                    workers.update(&batch);
                    let _ = apply(&index, &batch, &hits);
                }
            }
            let q = MatchExternalKvPrefixRequest {
                hashes: query,
                max_blocks,
            };
            for by_engine in [false, true] {
                let answer = match_prefix(&index, &workers.get(), by_engine, &q);
                for m in &answer.matches {
                    prop_assert!(m.matched_prefix_blocks <= answer.best_prefix_blocks);
                }
            }
        }
    }
}
