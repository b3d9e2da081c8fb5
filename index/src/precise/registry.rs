//! The engine-fed pods: each one's engine state, registered when its
//! subscription starts and dropped when it stops, and what lookups read of
//! them beside the tree (their group tables and their states).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Engine, EngineSpec, Ratio};
use crate::error::{EngineError, PodError};
use crate::index::Index;
use crate::named::Named;
use crate::precise::groups::GroupTable;
use crate::precise::states::PodState;
use crate::sync::Mutex;

/// One engine's state, shared by its subscription and snapshots.
pub type EngineHandle = Arc<parking_lot::Mutex<Engine>>;

/// Engine-fed pods by name. Each engine has its own lock, taken by its one
/// subscription and by snapshots; lookups never touch either: what they
/// read of engine-fed pods is published beside.
pub(crate) struct Registry {
    map: Mutex<HashMap<Box<str>, EngineHandle, ahash::RandomState>>,
    /// Hybrid pods' group tables (`crate::precise::groups`): lookups find such a
    /// pod's match by them. Changed when an engine names a new group.
    pub(crate) groups: Named<GroupTable>,
    /// Each pod's view and lower tiers (`crate::precise::states`), for detailed
    /// lookups. Changed by a follower's transitions and a pod's first
    /// lower-tier store.
    pub(crate) states: Named<PodState>,
}

impl Default for Registry {
    // By hand: loom's mutex, which replaces ours in model tests, has no
    // `Default`.
    fn default() -> Self {
        Registry {
            map: Mutex::new(HashMap::default()),
            groups: Named::new(),
            states: Named::new(),
        }
    }
}

impl Index {
    /// Registers `pod` as fed by its engine's events and returns its engine
    /// state (the existing one if it is registered already with the same
    /// block sizes). From now on its gateway inserts are speculative and it
    /// has no capacity of its own: the engine says what it evicts.
    pub fn engine(&self, pod: &str, spec: EngineSpec) -> Result<EngineHandle, EngineError> {
        let mut engines = self.engines.map.lock();
        if let Some(e) = engines.get(pod) {
            let mut engine = e.lock();
            let have = engine.spec;
            if (have.engine_block, have.our_block) == (spec.engine_block, spec.our_block) {
                // A restored engine takes the hash rule of its subscription.
                engine.spec.hash = spec.hash;
                drop(engine);
                return Ok(e.clone());
            }
        }
        let engine = Engine::new(spec, self.sh.cfg.max_block_ratio)?;
        let align = engine.align();
        self.precise_id(pod, align)?;
        let handle: EngineHandle = Arc::new(parking_lot::Mutex::new(engine));
        if let Some(old) = engines.insert(pod.into(), handle.clone()) {
            // Registered again with other block sizes: its records mean
            // nothing under the new ones.
            let mut old = old.lock();
            self.close_engine(&mut old);
            self.forget_groups(pod, &mut old);
            self.clear_engine_pod(pod, align)?;
        }
        Ok(handle)
    }

    /// Registers in one step the pods of `engines` whose block sizes
    /// [`Index::engine`] accepts, so that it then finds each one named: one
    /// copy of the pod registry for all of them rather than one each (see
    /// [`Index::register_pods`]). A pod whose engine it would refuse is left
    /// alone. Stops at the first name refused; those before it are
    /// registered.
    pub fn register_engine_pods<'a>(
        &self,
        engines: impl IntoIterator<Item = (&'a str, EngineSpec)>,
    ) -> Result<(), PodError> {
        let max = self.sh.cfg.max_block_ratio;
        self.register_pods(
            engines
                .into_iter()
                .filter(|(_, spec)| Ratio::new(spec.engine_block, spec.our_block, max).is_ok())
                .map(|(pod, _)| pod),
        )
    }

    /// Stops feeding `pod` from its engine: its engine state is dropped and
    /// the pod removed (a gateway insert registers it again, as a pod
    /// without an engine). Returns whether it was engine-fed.
    pub fn drop_engine_pod(&self, pod: &str) -> bool {
        self.drop_engine_pods(&[pod]).pop().unwrap_or(false)
    }

    /// Stops feeding each of `pods` from its engine, as
    /// [`Index::drop_engine_pod`] would one by one, with one copy each of
    /// the pod registry, the pods' states and their group tables for all of
    /// them (one by one, each copies those of every pod left: a fleet
    /// unsubscribed at once would cost their square). Whether each was
    /// engine-fed.
    pub fn drop_engine_pods(&self, pods: &[&str]) -> Vec<bool> {
        let mut dropped = Vec::new();
        let found = {
            let mut engines = self.engines.map.lock();
            pods.iter()
                .map(|&pod| match engines.remove(pod) {
                    Some(old) => {
                        dropped.push((pod, old));
                        true
                    }
                    None => false,
                })
                .collect()
        };
        for (_, old) in &dropped {
            // Under the engine's lock: an event being applied finishes
            // first, and none applied after it is closed names the pod
            // again, so the pod may go once the lock is released.
            let mut engine = old.lock();
            self.close_engine(&mut engine);
            engine.groups.clear();
            engine.pending.clear();
        }
        let pods: Vec<&str> = dropped.iter().map(|&(pod, _)| pod).collect();
        // The pods and their hidden pods (groups, lower tiers) vanish from
        // lookups at once, before their group tables go: a hybrid pod is
        // never seen live without its table.
        let hidden: Vec<String> = pods.iter().flat_map(|pod| self.hidden_names(pod)).collect();
        let names: Vec<&str> = pods
            .iter()
            .copied()
            .chain(hidden.iter().map(String::as_str))
            .collect();
        let pin = self.pin();
        self.sh.pods.remove_many(&names, &self.sh.epoch, &pin);
        self.forget_group_tables(&pods);
        self.forget_states(&pods);
        found
    }

    /// Uncounts every record of `engine` and closes it (events applied to it
    /// later change nothing).
    pub(crate) fn close_engine(&self, engine: &mut Engine) {
        self.budget().uncount(engine);
        self.unalias(engine);
        engine.models.clear();
        engine.clear_chain();
        engine.closed = true;
    }

    /// Every engine-fed pod, by name.
    pub fn engines(&self) -> Vec<(String, EngineHandle)> {
        let mut all: Vec<_> = self
            .engines
            .map
            .lock()
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}
