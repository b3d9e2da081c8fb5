//! Writing a snapshot: the pods, then each model's tree in pre-order
//! under one pin, then the engines' records (`engines.rs`) and the pods'
//! sets, each record hashed on its way out.

use std::collections::BTreeMap;
use std::io::{self, Write};

use xxhash_rust::xxh3::Xxh3;

use super::{Record, Stored, WriteSummary, MAGIC, ROOT, VERSION};
use crate::pods::PodId;
use crate::sets::split_set;
use crate::walk::Walk;
use crate::Index;

/// Feeds everything written into a hash on its way out.
pub(super) struct Hashing<W> {
    pub(super) inner: W,
    pub(super) hash: Xxh3,
    pub(super) bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Hashing<W> {
    pub(super) fn record(&mut self, r: &Record<'_>) -> io::Result<()> {
        bincode::encode_into_std_write(r, self, bincode::config::standard())
            .map(drop)
            .map_err(io::Error::other)
    }
}

impl Index {
    /// Writes a snapshot of everything visible at `now` (ms) to `out` (give it
    /// a buffered writer). Runs beside readers and writers without stopping
    /// them; entries expired at `now` and removed pods are left out.
    pub fn write_snapshot(&self, out: impl Write, now: u64) -> io::Result<WriteSummary> {
        let mut w = Hashing {
            inner: out,
            hash: Xxh3::new(),
            bytes: 0,
        };
        let mut sum = WriteSummary::default();
        w.write_all(&MAGIC)?;
        let sh = &self.sh;
        w.record(&Record::Header {
            version: VERSION,
            written_at: now,
            default_capacity: sh.pods.default_capacity(),
        })?;
        let pin = self.pin();
        // Pod id → its position in the pod list (u32::MAX: not written).
        let mut refs: Vec<u32> = Vec::new();
        let mut pods: Vec<(&str, u32)> = sh.pods.live(&pin).collect();
        pods.sort_unstable();
        for &(name, id) in &pods {
            let id = id as usize;
            if refs.len() <= id {
                refs.resize(id + 1, u32::MAX);
            }
            refs[id] = sum.pods as u32;
            w.record(&Record::Pod {
                name: Stored::of(name),
                capacity: sh.pods.capacity(id as u32),
            })?;
            sum.pods += 1;
        }
        let mut models: Vec<_> = self.models(&pin).iter().collect();
        models.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut entries = Vec::new();
        for (name, tree) in models {
            w.record(&Record::Model {
                name: Stored::of(name),
            })?;
            sum.models += 1;
            let mut written = 0u32;
            // Pre-order; each level carries its node's index in this model's
            // list (the root's is ROOT), the parent index of its children.
            let mut walk = Walk::new(tree.root(&pin), ROOT);
            loop {
                let Some(node) = walk.next_child() else {
                    if walk.leave().is_none() {
                        break;
                    }
                    continue;
                };
                entries.clear();
                for (pod, time) in node.pods.entries() {
                    // Engine-fed pods are written as their engine records.
                    let visible = now.saturating_sub(time) <= sh.ttl_ms
                        && sh.pods.is_live(pod)
                        && !sh.pods.is_precise(pod);
                    match refs.get(pod as usize) {
                        Some(&r) if visible && r != u32::MAX => entries.push((r, time)),
                        _ => {}
                    }
                }
                // pods(parent) ⊇ pods(child): nothing visible here, nothing below.
                if entries.is_empty() {
                    continue;
                }
                let parent = *walk.data();
                w.record(&Record::Node {
                    parent,
                    edge: Stored::of(&node.edge),
                    entries: Stored::of(&entries),
                })?;
                sum.entries += entries.len() as u64;
                walk.enter(node, written);
                written += 1;
            }
            sum.nodes += u64::from(written);
        }
        drop(pin);
        let engines = self.write_engines(&mut w, &mut sum)?;
        w.record(&Record::Engines {
            engines,
            blocks: sum.engine_blocks,
        })?;
        self.write_sets(&mut w)?;
        w.record(&Record::End {
            pods: sum.pods as u32,
            models: sum.models as u32,
            nodes: sum.nodes,
        })?;
        let digest = w.hash.digest();
        w.inner.write_all(&digest.to_le_bytes())?;
        w.inner.flush()?;
        sum.bytes = w.bytes + 8;
        Ok(sum)
    }
}

impl Index {
    /// Writes every pod's sets (`crate::sets`): the hashes each holds at
    /// the root of each model's tree, by model, then pod and set.
    fn write_sets(&self, w: &mut Hashing<impl Write>) -> io::Result<()> {
        let sh = &self.sh;
        let pin = self.pin();
        let mut models: Vec<_> = self.models(&pin).iter().collect();
        models.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (model, tree) in models {
            let mut sets: BTreeMap<(&str, u32), Vec<u64>> = BTreeMap::new();
            let mut walk = Walk::new(tree.root(&pin), ());
            while let Some(node) = walk.next_child() {
                let Some(&first) = node.edge.first() else {
                    continue;
                };
                node.pods.for_each(|id, _| {
                    if !sh.pods.is_live(id) || !sh.pods.is_hidden(id) {
                        return;
                    }
                    if let Some(held) = sh.pods.name(PodId(id), &pin).and_then(split_set) {
                        sets.entry(held).or_default().push(first);
                    }
                });
            }
            for ((pod, set), hashes) in &sets {
                w.record(&Record::SetBlocks {
                    model: Stored::of(model),
                    pod: Stored::of(pod),
                    set: *set,
                    hashes: Stored::of(hashes),
                })?;
            }
        }
        Ok(())
    }
}
