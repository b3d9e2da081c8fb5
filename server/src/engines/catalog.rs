//! The followed subscriptions as the answers read them: a map by pod,
//! published whole and rebuilt at the first read after a change.
//!
//! Tiered lookups name each pod's lower tiers by their media, and the
//! routers' drop-in routes (`crate::routers`) scope their answers by the
//! models and groups engines were registered with: both read the
//! subscriptions on every request. The followed set itself lives under the
//! lock subscriptions are made under, which a fleet's subscription holds
//! for a while; readers take this copy instead, without waiting. A change
//! counts one generation more (under that lock); a reader that finds its
//! copy older rebuilds it once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Subscription;

/// The subscriptions followed, by pod, as of one generation.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Every followed subscription (configured, run-time, or met by the
    /// central collector), by pod.
    pub subs: HashMap<String, Arc<Subscription>>,
    generation: u64,
}

impl Catalog {
    /// The media of `pod`'s lower tiers, in the order the index numbers
    /// them; none for a pod not followed.
    pub fn lower_media(&self, pod: &str) -> Vec<&str> {
        self.subs
            .get(pod)
            .map(|s| s.lower_media().collect())
            .unwrap_or_default()
    }
}

/// The published copy and the generation it is measured against.
#[derive(Default)]
pub(super) struct Published {
    copy: ArcSwap<Catalog>,
    generation: AtomicU64,
}

impl Published {
    /// Notes a change of the followed set; call it under the lock the
    /// set is changed under.
    pub(super) fn changed(&self) {
        // Release: pairs with the Acquire in `get`; the set itself is read
        // under its lock when rebuilt.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The current copy, rebuilt by `build` (under the set's lock, which
    /// it takes) if a change came since it was made.
    pub(super) fn get(&self, build: impl FnOnce() -> (u64, Vec<Subscription>)) -> Arc<Catalog> {
        let copy = self.copy.load_full();
        // Acquire: pairs with the Release in `changed`.
        if copy.generation == self.generation.load(Ordering::Acquire) {
            return copy;
        }
        let (generation, subs) = build();
        let fresh = Arc::new(Catalog {
            subs: subs
                .into_iter()
                .map(|s| (s.pod.clone(), Arc::new(s)))
                .collect(),
            generation,
        });
        self.copy.store(fresh.clone());
        fresh
    }

    /// The generation now; read it under the set's lock.
    pub(super) fn generation(&self) -> u64 {
        // Relaxed: the caller holds the lock every change is made under.
        self.generation.load(Ordering::Relaxed)
    }
}
