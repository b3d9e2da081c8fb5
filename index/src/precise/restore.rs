//! An engine-fed pod's records restored from a snapshot, and its entries
//! rebuilt from them.

use super::pages::held_groups;
use super::{Engine, Parent, Ratio, Record, PINNED};
use crate::error::EngineError;
use crate::index::Index;

impl Index {
    /// Loads `pod`'s records under `model` from a snapshot and rebuilds its
    /// entries: every held block's path, less the blocks with no copy left
    /// under held ones. A block named twice keeps its first record.
    pub(crate) fn restore_engine(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        blocks: Vec<(u64, Record)>,
    ) -> Result<(), EngineError> {
        let max = self.sh.cfg.max_engine_blocks;
        let max_own = self.sh.cfg.max_engine_blocks_per_pod;
        if (engine.blocks() as u64).saturating_add(blocks.len() as u64) > max_own {
            return Err(EngineError::PodFull { max: max_own });
        }
        let (ratio, align) = (engine.ratio, engine.align());
        let engine_block = engine.spec.engine_block as usize;
        if let Some((h, _)) = blocks
            .iter()
            .find(|(_, r)| !r.data.fits(ratio, engine_block))
        {
            return Err(EngineError::Record {
                hash: *h,
                why: "its data does not fit the engine's block sizes",
            });
        }
        if blocks.is_empty() {
            return Ok(());
        }
        // Room for every record at once (counted now, so a restore running
        // beside stores never passes the bound with them); what duplicates
        // leave unused goes back.
        let room = self.budget().reserve(blocks.len());
        if room < blocks.len() as u64 {
            self.budget().count(0, -(room as i64));
            return Err(EngineError::Full { max });
        }
        let max_key = self.sh.cfg.max_key_blocks;
        let ruled = engine.ruled();
        let records = engine.models.entry(model.into()).or_default();
        let (mut unused, mut bytes, mut full) = (blocks.len() as i64, 0, false);
        for (h, r) in blocks {
            if records.find(h).is_some() {
                continue;
            }
            let Some(at) = records.insert(h, r.parent, r.copies, r.data) else {
                full = true;
                break;
            };
            unused -= 1;
            bytes += records.record_bytes(at) as i64;
        }
        self.budget().count(bytes, -unused);
        if full {
            return Err(EngineError::Full { max });
        }
        if ruled {
            // Each group's blocks one at a time (see `lanes`).
            return self.place_lane(engine, pod, model, 0);
        }
        let records = &*records;
        // Held blocks with no held child: their paths cover every held one.
        let mut held_parent = vec![false; records.span()];
        for at in records.positions() {
            if let (true, Parent::At(p)) = (records.copies(at) > 0, records.parent(at)) {
                held_parent[p as usize] = true;
            }
        }
        for at in records.positions() {
            if records.copies(at) == 0 || held_parent[at as usize] {
                continue;
            }
            let h = records.hash(at);
            let Ok(key) = Engine::path(records, ratio, h, max_key) else {
                continue;
            };
            let key = match ratio {
                Ratio::Whole(_) => key,
                Ratio::Pages(n) => held_groups(records, h, n, key),
            };
            if !key.is_empty() {
                self.insert_at(model, &key, pod, align, PINNED)?;
            }
        }
        for at in records.positions() {
            if records.copies(at) == 0 && records.children(at) > 0 {
                let path = Engine::path(records, ratio, records.hash(at), max_key);
                let path = path.as_deref().map_err(|e| *e);
                let id = self.precise_id(pod, align)?;
                self.release_block(records, ratio, id, model, at, path)?;
            }
        }
        Ok(())
    }
}
