//! A plain sequential model of the index semantics (DESIGN.md §3), used as the
//! oracle of the property and stress tests.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

pub mod fnv;

/// Every prefix of every inserted key, with each pod's last-used time.
#[derive(Default)]
pub struct Model {
    pub ttl: u64,
    pub default_capacity: u64,
    pub capacity: HashMap<String, u64>,
    /// model -> prefix -> pod -> last used
    pub prefixes: HashMap<String, BTreeMap<Vec<u64>, HashMap<String, u64>>>,
}

impl Model {
    pub fn new(ttl: u64, default_capacity: u64) -> Self {
        Model {
            ttl,
            default_capacity,
            ..Model::default()
        }
    }

    pub fn insert(&mut self, model: &str, key: &[u64], pod: &str, now: u64) {
        let tree = self.prefixes.entry(model.to_owned()).or_default();
        for i in 1..=key.len() {
            let t = tree
                .entry(key[..i].to_vec())
                .or_default()
                .entry(pod.to_owned())
                .or_insert(now);
            *t = (*t).max(now);
        }
    }

    pub fn lookup(
        &self,
        model: &str,
        key: &[u64],
        cands: Option<&[&str]>,
        now: u64,
    ) -> Vec<(String, u32)> {
        let mut best: HashMap<&str, u32> = HashMap::new();
        if let Some(tree) = self.prefixes.get(model) {
            for i in 1..=key.len() {
                let Some(pods) = tree.get(&key[..i]) else {
                    break;
                };
                for (pod, &t) in pods {
                    if now.saturating_sub(t) > self.ttl {
                        continue;
                    }
                    if cands.is_some_and(|c| !c.contains(&pod.as_str())) {
                        continue;
                    }
                    best.insert(pod, i as u32);
                }
            }
        }
        let mut out: Vec<(String, u32)> =
            best.into_iter().map(|(p, b)| (p.to_owned(), b)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    pub fn remove_pod(&mut self, pod: &str) {
        for tree in self.prefixes.values_mut() {
            for pods in tree.values_mut() {
                pods.remove(pod);
            }
            tree.retain(|_, pods| !pods.is_empty());
        }
        self.capacity.remove(pod);
    }

    pub fn set_capacity(&mut self, pod: &str, blocks: u64) {
        self.capacity.insert(pod.to_owned(), blocks);
    }

    /// TTL expiry, then each pod's least recently used blocks (deepest first)
    /// past its capacity.
    pub fn sweep(&mut self, now: u64) {
        let ttl = self.ttl;
        for tree in self.prefixes.values_mut() {
            for pods in tree.values_mut() {
                pods.retain(|_, t| now.saturating_sub(*t) <= ttl);
            }
        }
        // pod -> (last used, depth, model, prefix) of each block it holds
        type Blocks = Vec<(u64, usize, String, Vec<u64>)>;
        let mut per_pod: HashMap<String, Blocks> = HashMap::new();
        for (model, tree) in &self.prefixes {
            for (prefix, pods) in tree {
                for (pod, &t) in pods {
                    per_pod.entry(pod.clone()).or_default().push((
                        t,
                        prefix.len(),
                        model.clone(),
                        prefix.clone(),
                    ));
                }
            }
        }
        for (pod, mut blocks) in per_pod {
            let cap = self
                .capacity
                .get(&pod)
                .copied()
                .unwrap_or(self.default_capacity) as usize;
            if blocks.len() <= cap {
                continue;
            }
            blocks.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let excess = blocks.len() - cap;
            for (_, _, model, prefix) in blocks.into_iter().take(excess) {
                if let Some(pods) = self
                    .prefixes
                    .get_mut(&model)
                    .and_then(|t| t.get_mut(&prefix))
                {
                    pods.remove(&pod);
                }
            }
        }
        for tree in self.prefixes.values_mut() {
            tree.retain(|_, pods| !pods.is_empty());
        }
    }

    /// Stored (pod, block) pairs.
    pub fn entries(&self) -> u64 {
        self.prefixes
            .values()
            .flat_map(|t| t.values())
            .map(|p| p.len() as u64)
            .sum()
    }

    /// Distinct stored blocks (one per prefix held by any pod).
    pub fn tree_blocks(&self) -> u64 {
        self.prefixes.values().map(|t| t.len() as u64).sum()
    }
}
