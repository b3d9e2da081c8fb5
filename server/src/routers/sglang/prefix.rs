//! Reads of the bridges' sets: the prefix each worker holds of a prompt
//! (`MatchExternalKvPrefix`), by the rules of its cache spec, and which
//! worker holds which hashes at which tier (`MatchExternalKv`).
//!
//! Without a spec (the legacy form) a worker's prefix is the run of
//! leading hashes it holds at any tier; one whose matched blocks carry
//! component detail (a mask) is answered 0, as it cannot be read without
//! a spec. With a valid spec (SGLang's `WorkerPrefixScanner`): a block
//! counts while a servable tier (GPU or host memory) the spec allows
//! holds its FULL component; a boundary counts when, besides, a
//! sliding-window component has held an unbroken run of the window's
//! tokens (or every block from the head) and a Mamba component holds the
//! state at it. Storage is never servable under a spec.

use std::collections::HashMap;

use prefix_index::Index;

use super::hits::Hits;
use super::pb::{
    ExternalKvNodeMatch, ExternalKvPrefixMatch, MatchExternalKvPrefixRequest,
    MatchExternalKvPrefixResponse, MatchExternalKvRequest, MatchExternalKvResponse, TierHashes,
    WorkerCacheSpec,
};
use super::sets::{bit, set_of, tier_of, PER_TIER};
use super::workers::{Worker, WorkerMap};
use super::SET_MODEL;

/// Component bits of a spec.
const FULL: u32 = 1;
const SWA: u32 = 2;
const MAMBA: u32 = 4;
/// The spec version understood.
const SPEC_VERSION: u32 = 1;
/// Tiers a spec's components are served from: GPU and host memory.
const SERVABLE: u32 = 1 << 1 | 1 << 2;

/// The sets of one worker holding one block, as a bitmask of set
/// indexes.
type Held = u32;

/// One candidate's walk over the prompt's blocks.
struct Scan<'w> {
    id: &'w str,
    worker: Option<&'w Worker>,
    /// Blocks matched so far (the answer, unless `tainted`).
    best: u32,
    /// Blocks walked before the run ended.
    walked: u32,
    open: bool,
    /// Legacy: a matched block carried component detail.
    tainted: bool,
    swa_run: u64,
    swa_broken: bool,
}

impl<'w> Scan<'w> {
    fn new(id: &'w str, worker: Option<&'w Worker>) -> Self {
        Scan {
            id,
            worker,
            best: 0,
            walked: 0,
            open: true,
            tainted: false,
            swa_run: 0,
            swa_broken: false,
        }
    }

    /// Takes the next block, held by the sets `held`.
    fn step(&mut self, held: Held) {
        let spec = self.worker.and_then(|w| w.spec.as_ref());
        match spec {
            None => {
                if held == 0 {
                    self.open = false;
                    return;
                }
                let components = (1..=3)
                    .flat_map(|t| (1..PER_TIER).map(move |c| set_of(t, c)))
                    .any(|s| held & 1 << s != 0);
                self.tainted |= components;
                self.walked += 1;
                self.best = self.walked;
            }
            Some(spec) => self.step_spec(spec, held),
        }
    }

    fn step_spec(&mut self, spec: &WorkerCacheSpec, held: Held) {
        let valid = spec.components != 0
            && spec.version <= SPEC_VERSION
            && (spec.components & SWA == 0 || spec.swa_window_tokens > 0);
        let available = |component: u32, tiers: u32| {
            let c = match component {
                FULL => 1,
                SWA => 2,
                _ => 3,
            };
            (1..=2).any(|t: i32| {
                let tier_bit = 1 << t;
                SERVABLE & tiers & tier_bit != 0 && held & 1 << set_of(t, c) != 0
            })
        };
        if !valid || !available(FULL, spec.full_tier_mask) {
            self.open = false;
            return;
        }
        self.walked += 1;
        let mut boundary = true;
        if spec.components & SWA != 0 {
            if available(SWA, spec.swa_tier_mask) {
                let tokens = self.worker.map_or(0, |w| w.block_size);
                self.swa_run += u64::from(tokens);
                boundary &= !self.swa_broken || self.swa_run >= u64::from(spec.swa_window_tokens);
            } else {
                self.swa_run = 0;
                self.swa_broken = true;
                boundary = false;
            }
        }
        if spec.components & MAMBA != 0 {
            boundary &= available(MAMBA, spec.mamba_tier_mask);
        }
        if boundary {
            self.best = self.walked;
        }
    }

    fn answer(&self) -> u32 {
        match self.tainted {
            true => 0,
            false => self.best,
        }
    }
}

/// Each worker's sets holding `hash`, by worker id.
fn holders<'r>(reader: &'r prefix_index::Reader<'_>, hash: i64, out: &mut Vec<(&'r str, u32)>) {
    out.clear();
    reader.set_holders(SET_MODEL, hash as u64, out);
}

/// `MatchExternalKvPrefix`: each worker holding the first hash, with the
/// run of leading hashes it holds by its rules; with `by_engine`, pods
/// followed through SGLang's own events too (their hashes are our
/// aliases of their blocks).
pub fn match_prefix(
    index: &Index,
    workers: &WorkerMap,
    by_engine: bool,
    q: &MatchExternalKvPrefixRequest,
) -> MatchExternalKvPrefixResponse {
    let limit = match q.max_blocks {
        0 => q.hashes.len(),
        m => q.hashes.len().min(m as usize),
    };
    let hashes = &q.hashes[..limit];
    let reader = index.reader();
    let mut held = Vec::new();
    let mut matches = Vec::new();
    let mut read = 0u32;
    if let Some(&first) = hashes.first() {
        holders(&reader, first, &mut held);
        let mut scans: Vec<Scan<'_>> = Vec::new();
        for &(id, _) in &held {
            if !scans.iter().any(|s| s.id == id) {
                scans.push(Scan::new(id, workers.get(id)));
            }
        }
        read = 1;
        for (i, &h) in hashes.iter().enumerate() {
            if scans.iter().all(|s| !s.open) {
                break;
            }
            if i > 0 {
                holders(&reader, h, &mut held);
                read = i as u32 + 1;
            }
            for scan in scans.iter_mut().filter(|s| s.open) {
                let sets = held
                    .iter()
                    .filter(|(id, _)| *id == scan.id)
                    .fold(0, |m, &(_, set)| m | 1 << set);
                scan.step(sets);
            }
        }
        for scan in &scans {
            let address = scan.worker.map_or("", |w| w.address.as_str());
            let blocks = scan.answer();
            if blocks > 0 && !address.is_empty() {
                matches.push(ExternalKvPrefixMatch {
                    worker_address: address.into(),
                    matched_prefix_blocks: blocks,
                    worker_id: scan.id.into(),
                });
            }
        }
    }
    if by_engine {
        matches.extend(engine_matches(&reader, hashes));
    }
    matches.sort_by(|a, b| {
        b.matched_prefix_blocks
            .cmp(&a.matched_prefix_blocks)
            .then_with(|| a.worker_id.cmp(&b.worker_id))
    });
    MatchExternalKvPrefixResponse {
        best_prefix_blocks: matches.first().map_or(0, |m| m.matched_prefix_blocks),
        blocks_read: read.max(u32::from(!hashes.is_empty())),
        matches,
    }
}

/// The pods followed through SGLang's own events that hold a prefix of
/// `hashes` (their engine hashes), each by its pod name.
fn engine_matches(reader: &prefix_index::Reader<'_>, hashes: &[i64]) -> Vec<ExternalKvPrefixMatch> {
    let names: Vec<u64> = hashes.iter().map(|&h| h as u64).collect();
    let Some(&first) = names.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut widths = Vec::new();
    for model in reader.alias_models(first) {
        let key = reader.translate_counted(model, &names, &mut widths);
        let found = reader.lookup(model, &key, None, crate::clock::now_ms());
        for m in &found.matches {
            let Some(pod) = reader.pod_name(m.pod) else {
                continue;
            };
            // Whole engine blocks within the match.
            let mut ours = 0;
            let blocks = widths
                .iter()
                .take_while(|&&w| {
                    ours += w;
                    ours <= m.blocks
                })
                .count() as u32;
            if blocks > 0 {
                out.push(ExternalKvPrefixMatch {
                    worker_address: pod.into(),
                    matched_prefix_blocks: blocks,
                    worker_id: pod.into(),
                });
            }
        }
    }
    out
}

/// `MatchExternalKv`: for each worker holding any of the hashes (each once,
/// in order), the hashes it holds by tier, each with its component mask
/// and its worker's block size; a counting match counts a hit on each
/// hash some worker holds.
pub fn match_all(
    index: &Index,
    workers: &WorkerMap,
    hits: &Hits,
    q: &MatchExternalKvRequest,
) -> MatchExternalKvResponse {
    let reader = index.reader();
    let mut seen = std::collections::HashSet::new();
    let mut held = Vec::new();
    let mut order: Vec<String> = Vec::new();
    // Worker → tier → (hash, mask), in the request's order.
    let mut found: HashMap<String, Vec<(i32, i64, u32)>> = HashMap::new();
    let mut counted = Vec::new();
    for &h in &q.hashes {
        if !seen.insert(h) {
            continue;
        }
        holders(&reader, h, &mut held);
        if held.is_empty() {
            continue;
        }
        counted.push(h);
        // Each worker's mask per tier of this hash.
        let mut masks: Vec<(&str, i32, u32)> = Vec::new();
        for &(id, set) in &held {
            let (tier, c) = tier_of(set);
            let add = if c == 0 { 0 } else { bit(c) };
            match masks.iter_mut().find(|m| m.0 == id && m.1 == tier) {
                Some(m) => m.2 |= add,
                None => masks.push((id, tier, add)),
            }
        }
        for (id, tier, mask) in masks {
            if !found.contains_key(id) {
                order.push(id.into());
            }
            found.entry(id.into()).or_default().push((tier, h, mask));
        }
    }
    if q.count_as_hit {
        hits.count(&counted);
    }
    let matches = order
        .into_iter()
        .map(|id| {
            let worker = workers.get(&id);
            let size = worker.map_or(0, |w| w.block_size);
            let mut held = found.remove(&id).unwrap_or_default();
            held.sort_by_key(|&(tier, _, _)| tier);
            let mut by_tier: Vec<TierHashes> = Vec::new();
            for (tier, h, mask) in held {
                if by_tier.last().is_none_or(|t| t.tier != tier) {
                    by_tier.push(TierHashes {
                        tier,
                        ..TierHashes::default()
                    });
                }
                if let Some(t) = by_tier.last_mut() {
                    t.hashes.push(h);
                    t.component_masks.push(mask);
                    t.block_sizes.push(size);
                }
            }
            ExternalKvNodeMatch {
                address: worker.map(|w| w.address.clone()).unwrap_or_default(),
                worker_id: id,
                hashes_by_tier: by_tier,
            }
        })
        .collect();
    MatchExternalKvResponse { matches }
}
