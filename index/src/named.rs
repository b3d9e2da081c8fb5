//! A map by pod name that lookups read without a lock: published
//! copy-on-write (`reclaim::Published`), each change a whole copy made
//! under the map's own writer lock. Changes come at control-plane rate (an
//! engine naming a group, a follower changing its view), lookups at data-
//! plane rate, so copying on change is the cheap side.

use std::collections::HashMap;

use crate::reclaim::{Epoch, Pin, Published};
use crate::sync::Mutex;

/// The map readers get.
pub(crate) type ByName<V> = HashMap<Box<str>, V, ahash::RandomState>;

/// A map by pod name, read under a pin, changed copy-on-write.
pub(crate) struct Named<V: Send + Sync + 'static> {
    map: Published<ByName<V>>,
    writer: Mutex<()>,
    /// Maps published: what the tests hold the copies to.
    #[cfg(test)]
    copies: std::sync::atomic::AtomicUsize,
}

impl<V: Clone + PartialEq + Send + Sync + 'static> Named<V> {
    pub(crate) fn new() -> Self {
        Named {
            map: Published::new(Box::default()),
            writer: Mutex::new(()),
            #[cfg(test)]
            copies: Default::default(),
        }
    }

    /// The map, for the life of `pin`.
    #[inline]
    pub(crate) fn get<'g>(&'g self, pin: &'g Pin) -> &'g ByName<V> {
        self.map.get(pin)
    }

    /// Makes the next map from the current one under the writer lock
    /// (`rewrite` leaves `next` as `None` to keep the current one) and
    /// publishes it.
    fn rewrite(
        &self,
        epoch: &Epoch,
        pin: &Pin,
        rewrite: impl FnOnce(&ByName<V>, &mut Option<ByName<V>>),
    ) {
        let _w = self.writer.lock();
        let current = self.map.get(pin);
        let mut next = None;
        rewrite(current, &mut next);
        if let Some(next) = next {
            self.map.replace(Box::new(next), epoch, pin);
            // Relaxed: a count the tests read after the writes.
            #[cfg(test)]
            self.copies
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sets `pod`'s value (`None` removes it); returns whether it changed.
    pub(crate) fn set(&self, pod: &str, value: Option<V>, epoch: &Epoch, pin: &Pin) -> bool {
        let mut changed = false;
        self.rewrite(epoch, pin, |current, next| {
            if current.get(pod) == value.as_ref() {
                return;
            }
            let mut map = current.clone();
            match value {
                Some(v) => map.insert(pod.into(), v),
                None => map.remove(pod),
            };
            (*next, changed) = (Some(map), true);
        });
        changed
    }

    /// Changes the value of each pod of `items` by `change(value, item)`
    /// (from `V`'s default where it has none), in one copy of the map, and
    /// none when no value changes: thousands of pods changing at once (a
    /// fleet's engines connecting) copy it once.
    pub(crate) fn update<'a, T>(
        &self,
        items: impl IntoIterator<Item = (&'a str, T)>,
        change: impl Fn(&mut V, T),
        epoch: &Epoch,
        pin: &Pin,
    ) where
        V: Default,
    {
        self.rewrite(epoch, pin, |current, next| {
            for (pod, item) in items {
                let map = next.as_ref().unwrap_or(current);
                let mut value = map.get(pod).cloned().unwrap_or_default();
                change(&mut value, item);
                if map.get(pod) != Some(&value) {
                    next.get_or_insert_with(|| current.clone())
                        .insert(pod.into(), value);
                }
            }
        });
    }

    /// [`Named::update`] of one pod, which takes the writer lock only when
    /// its value changes (most calls change nothing).
    pub(crate) fn update_one(&self, pod: &str, change: impl Fn(&mut V), epoch: &Epoch, pin: &Pin)
    where
        V: Default,
    {
        let current = self.map.get(pin).get(pod);
        let mut value = current.cloned().unwrap_or_default();
        change(&mut value);
        if current != Some(&value) {
            self.update([(pod, ())], |v, ()| change(v), epoch, pin);
        }
    }

    /// Forgets `pods`, with one copy for all of them, none when the map
    /// holds none of them.
    pub(crate) fn forget(&self, pods: &[&str], epoch: &Epoch, pin: &Pin) {
        self.rewrite(epoch, pin, |current, next| {
            if pods.iter().any(|pod| current.contains_key(*pod)) {
                let mut map = current.clone();
                for pod in pods {
                    map.remove(*pod);
                }
                *next = Some(map);
            }
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// What a change published: the map readers get after it.
    fn map(named: &Named<u32>, epoch: &Epoch) -> Vec<(String, u32)> {
        let pin = epoch.pin();
        let mut items: Vec<_> = named
            .get(&pin)
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        items.sort();
        items
    }

    fn copies(named: &Named<u32>) -> usize {
        // Relaxed: read after the writes, on their thread or after a join.
        named.copies.load(Ordering::Relaxed)
    }

    fn items(pairs: &[(&str, u32)]) -> Vec<(String, u32)> {
        pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn a_set_publishes_a_copy_only_when_the_value_changes() {
        let (named, epoch) = (Named::<u32>::new(), Epoch::default());
        let pin = epoch.pin();
        assert!(named.set("a", Some(1), &epoch, &pin));
        assert!(!named.set("a", Some(1), &epoch, &pin));
        assert!(!named.set("b", None, &epoch, &pin));
        assert_eq!(copies(&named), 1);
        assert!(named.set("a", None, &epoch, &pin));
        assert_eq!((map(&named, &epoch), copies(&named)), (vec![], 2));
    }

    #[test]
    fn an_update_of_many_pods_is_one_copy_from_each_ones_value() {
        let (named, epoch) = (Named::<u32>::new(), Epoch::default());
        let pin = epoch.pin();
        named.set("a", Some(10), &epoch, &pin);
        named.update([("a", 1), ("b", 2), ("a", 3)], |v, d| *v += d, &epoch, &pin);
        assert_eq!(map(&named, &epoch), items(&[("a", 14), ("b", 2)]));
        assert_eq!(copies(&named), 2);
        // Nothing changes: nothing is copied.
        named.update([("a", 0), ("b", 0)], |v, d| *v += d, &epoch, &pin);
        named.update_one("a", |v| *v = 14, &epoch, &pin);
        assert_eq!(copies(&named), 2);
        named.update_one("c", |v| *v = 5, &epoch, &pin);
        let all = items(&[("a", 14), ("b", 2), ("c", 5)]);
        assert_eq!((map(&named, &epoch), copies(&named)), (all, 3));
    }

    #[test]
    fn forgetting_pods_removes_them_and_leaves_the_rest() {
        let (named, epoch) = (Named::<u32>::new(), Epoch::default());
        let pin = epoch.pin();
        named.update([("a", 1), ("b", 2), ("c", 3)], |v, x| *v = x, &epoch, &pin);
        named.forget(&["x", "y"], &epoch, &pin);
        assert_eq!(copies(&named), 1);
        named.forget(&["a", "c", "x"], &epoch, &pin);
        assert_eq!(
            (map(&named, &epoch), copies(&named)),
            (items(&[("b", 2)]), 2)
        );
    }

    /// Writers on other threads, each changing pods of its own: every
    /// change is in the map at the end (a copy made outside the writer
    /// lock would lose some).
    #[test]
    fn concurrent_writers_lose_no_change() {
        let (named, epoch) = (Named::<u32>::new(), Epoch::default());
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let (named, epoch) = (&named, &epoch);
                s.spawn(move || {
                    for i in 0..200u32 {
                        let (pod, pin) = (format!("{t}-{i}"), epoch.pin());
                        match i % 2 {
                            0 => named.update_one(&pod, |v| *v = i, epoch, &pin),
                            _ => assert!(named.set(&pod, Some(i), epoch, &pin)),
                        }
                    }
                });
            }
        });
        let got = map(&named, &epoch);
        assert_eq!(got.len(), 800);
        assert!(got.iter().all(|(pod, v)| pod.ends_with(&format!("-{v}"))));
    }
}
