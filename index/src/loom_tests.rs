//! Loom models of the lock-free protocols: the slot handshakes of `slots`,
//! the publish/grow/retire protocol of `children`, the recycling of pod
//! ids in `pods` (the two grace periods before a removed pod's id is reused),
//! the bounded counters of `stats`, and the window and standing of a
//! pod's `receipts`.
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release -p prefix-index --lib loom --target-dir target/loom`
//! (its own target directory: `--cfg loom` rebuilds every dependency).
//!
//! The code under test is the crate's own, compiled with `sync`'s loom
//! atomics and locks. The pod models also run `reclaim`'s epoch, which under
//! loom is `sync::epoch`'s model of crossbeam-epoch: it keeps crossbeam's
//! guarantee (a deferred function runs after every thread pinned when it was
//! deferred has unpinned) in a form loom can see; crossbeam-epoch itself is
//! tested by its authors. In the node models retired memory is freed after
//! the threads join.

// std's, not loom's: counters that outlive one execution of a model.
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::Arc;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

use crate::children::{Children, Keyed, Table};
use crate::node::Node;
use crate::pods::{PodId, Pods};
use crate::reclaim::{Epoch, Participant};
use crate::slots::{PodSlots, Refresh};

/// A refresh racing with a seal is either in the sealer's snapshot or told to
/// redo its work: it is never lost.
#[test]
fn loom_refresh_never_lost_to_a_seal() {
    loom::model(|| {
        let slots = Arc::new(PodSlots::new(&[(1, 10), (2, 10)]));
        let s = slots.clone();
        let refresher = thread::spawn(move || s.refresh(1, 20));
        let snapshot = slots.seal();
        let outcome = refresher.join().unwrap();
        let in_snapshot = snapshot.contains(&(1, 20));
        assert!(
            in_snapshot || outcome == Refresh::Sealed,
            "refresh {outcome:?} lost: {snapshot:?}"
        );
    });
}

/// Two refreshers (one that must write, one whose time is already newer) and a
/// seal: each refresh is in the snapshot or was told the node is sealed.
#[test]
fn loom_two_refreshes_and_a_seal() {
    loom::model(|| {
        let slots = Arc::new(PodSlots::new(&[(1, 10), (2, 30)]));
        let (a, b) = (slots.clone(), slots.clone());
        let ra = thread::spawn(move || a.refresh(1, 20));
        let rb = thread::spawn(move || b.refresh(2, 25));
        let snapshot = slots.seal();
        let (oa, ob) = (ra.join().unwrap(), rb.join().unwrap());
        assert!(
            oa == Refresh::Sealed || snapshot.contains(&(1, 20)),
            "{oa:?} {snapshot:?}"
        );
        assert!(
            ob == Refresh::Sealed || snapshot.contains(&(2, 30)),
            "{ob:?} {snapshot:?}"
        );
        assert_eq!(slots.refresh(1, 99), Refresh::Sealed);
    });
}

/// The sweep's conditional removal and a refresh: exactly one wins, and the
/// outcome each reports matches the final state.
#[test]
fn loom_remove_and_refresh_agree() {
    loom::model(|| {
        let slots = Arc::new(PodSlots::new(&[(1, 10)]));
        let s = slots.clone();
        let refresher = thread::spawn(move || s.refresh(1, 20));
        let removed = slots.remove_if(1, |t| t < 15);
        let outcome = refresher.join().unwrap();
        match removed {
            Some(10) => {
                assert_eq!(outcome, Refresh::Missing);
                assert_eq!(slots.find(1), None);
            }
            None => {
                assert_eq!(outcome, Refresh::Done);
                assert_eq!(slots.find(1), Some(20));
            }
            other => panic!("removed {other:?}"),
        }
    });
}

/// A reader sees a pod added under the lock either whole or not at all, even
/// when the add spills into a new chunk.
#[test]
fn loom_added_pod_is_seen_whole() {
    loom::model(|| {
        let slots = Arc::new(PodSlots::new(&[(1, 5), (2, 6)]));
        let s = slots.clone();
        let reader = thread::spawn(move || {
            let mut seen = Vec::new();
            s.for_each(|p, t| seen.push((p, t)));
            seen
        });
        slots.add(3, 7);
        let seen = reader.join().unwrap();
        assert!(seen.starts_with(&[(1, 5), (2, 6)]));
        assert!(seen.len() == 2 || seen[2] == (3, 7), "{seen:?}");
    });
}

struct Child {
    key: u64,
    payload: AtomicU64,
}

impl Keyed for Child {
    fn key(&self) -> u64 {
        self.key
    }
}

fn child(key: u64) -> *mut Child {
    let c = Box::new(Child {
        key,
        payload: AtomicU64::new(0),
    });
    // Relaxed: pairs with nothing on purpose: only the table's Release
    // publication may order it.
    c.payload.store(key * 10, Ordering::Relaxed);
    Box::into_raw(c)
}

/// Publication and growth: a reader racing with an insert that grows the table
/// always finds the child that was there before, and finds the new child either
/// fully initialised or not at all.
#[test]
fn loom_publish_and_grow() {
    loom::model(|| {
        let table = Arc::new(Children::new());
        let first = child(1);
        // SAFETY: no other thread yet (the lock's job); `first` is a fresh box.
        assert!(unsafe { table.insert(first, 0) }.1.is_none());
        let t = table.clone();
        let reader = thread::spawn(move || {
            // SAFETY: every child and retired table is freed only after this
            // thread is joined.
            let loaded = unsafe { t.load() };
            let a = loaded.get(1, 0);
            assert!(a.is_some(), "an old child went missing during growth");
            if let Some(b) = loaded.get(2, 0) {
                // Relaxed: pairs with nothing; the slot's Acquire load
                // ordered the child's initialisation before this.
                assert_eq!(b.payload.load(Ordering::Relaxed), 20);
            }
        });
        let second = child(2);
        // Growth retires the old table, freed only after the reader joined.
        // SAFETY: the only writer; `second` is a fresh box.
        let (_, retired) = unsafe { table.insert(second, 0) };
        reader.join().unwrap();
        // SAFETY: the reader is gone; this thread owns every object.
        unsafe {
            if let Some(old) = retired {
                Table::free(old.into_box());
            }
            table.free_table();
            drop(Box::from_raw(first));
            drop(Box::from_raw(second));
        }
    });
}

/// Replacement (an edge split) and removal: a reader sees the old child, the
/// new one, or (after removal) nothing, never a torn slot.
#[test]
fn loom_replace_then_remove() {
    loom::model(|| {
        let table = Arc::new(Children::new());
        let (old, new) = (child(5), child(5));
        // Relaxed: pairs with nothing; ordered by the Release publication in
        // `replace`.
        // SAFETY: `new` is a fresh box, private until published.
        unsafe { (*new).payload.store(99, Ordering::Relaxed) };
        // SAFETY: single writer; `old` is a fresh box.
        let _ = unsafe { table.insert(old, 0) };
        let t = table.clone();
        let reader = thread::spawn(move || {
            // SAFETY: both children are freed only after this thread joined.
            if let Some(p) = unsafe { t.load() }.get(5, 0) {
                // Relaxed: pairs with nothing; the slot's Acquire load
                // ordered the child's initialisation before this.
                let v = p.payload.load(Ordering::Relaxed);
                assert!(v == 50 || v == 99, "torn child: {v}");
            }
        });
        // SAFETY: single writer; `old` is in the table, `new` a fresh box
        // with its key, then in the table in its place.
        unsafe {
            assert!(table.replace(old, new, 0).is_some());
            assert!(table.remove(new, 0).is_some());
        }
        reader.join().unwrap();
        // SAFETY: the reader is gone; this thread owns every object.
        unsafe {
            table.free_table();
            drop(Box::from_raw(old));
            drop(Box::from_raw(new));
        }
    });
}

/// The explorer for the pod models: at most five preemptions per schedule
/// (`LOOM_MAX_PREEMPTIONS` overrides it). Unbounded, the first model runs for
/// hours; skipping the first grace period fails it from three preemptions
/// on, skipping the second fails the other from two, and five take seconds.
fn pods_explorer() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(5);
    builder
}

/// How many maintenance rounds a pod model runs: enough for an id with no
/// insert or reader in the way to come back (grace period, purge, grace
/// period, free), and one to spare.
const ROUNDS: usize = 4;

/// One round of the maintenance thread, as `Index::sweep` runs it: a pass
/// ends (`recycle`, and an insert of "b" that takes the id if it is free
/// again), the epoch advances as far as pins allow, and the next pass purges
/// removed pods' entries from the node. Returns b's id once it has one.
fn maintain(pods: &Pods, epoch: &Epoch, me: &Participant, node: &Node) -> Option<PodId> {
    let mut b = None;
    for _ in 0..ROUNDS {
        {
            let pin = me.pin();
            pods.recycle(epoch, &pin);
            if b.is_none() {
                b = pods.intern("b", 8, epoch, &pin).ok();
            }
        }
        for _ in 0..2 {
            me.pin().flush();
        }
        epoch.reclaim_ready();
        // The sweep's purge: under the node's lock, as `Sweeper::visit_one`.
        let _lock = node.lock();
        for (pod, _) in node.pods.entries() {
            if !pods.is_live(pod) && node.pods.remove_if(pod, |_| true).is_some() {
                pods.add_blocks(pod, -1);
            }
        }
    }
    b
}

/// A model's setup: one pod id in all (so b can only have a's old id), pod
/// "a" interned, and a one-block node; the maintenance thread's participant.
fn pods_model() -> (Arc<Pods>, Arc<Epoch>, Participant, Arc<Node>) {
    let epoch = Arc::new(Epoch::default());
    let pods = Arc::new(Pods::new(1, 100));
    let me = epoch.register();
    let a = pods.intern("a", 8, &epoch, &me.pin());
    assert_eq!(a, Ok(PodId(0)));
    let node = Arc::from(Node::new(&[7], &[], Children::new()));
    (pods, epoch, me, node)
}

/// Models an insert for pod "a" that looked its id up before "a" was removed
/// and writes the entry after: `recycle`'s first grace period. Until it has
/// passed, the id's block count is not final (such an insert may still count
/// and write blocks), so the id must not be freed on a count of zero read
/// earlier. Breaking that (freeing after the second grace period alone) lets
/// "b" take the id while the node still holds a's entry, and this fails.
#[test]
fn loom_recycled_id_waits_for_inserts_in_flight() {
    static REUSED: StdAtomicUsize = StdAtomicUsize::new(0);
    pods_explorer().check(|| {
        let (pods, epoch, me, node) = pods_model();
        let inserter = thread::spawn({
            let (pods, epoch, node) = (pods.clone(), epoch.clone(), node.clone());
            move || {
                let me = epoch.register();
                {
                    let pin = me.pin();
                    // `Tree::insert`: the id, then `reserve`, then the entry.
                    let Some(id) = pods.id("a", &pin) else {
                        return;
                    };
                    pods.add_blocks(id.get(), 1);
                    let _lock = node.lock();
                    if node.pods.refresh(id.get(), 10) == Refresh::Missing {
                        node.pods.add(id.get(), 10);
                    }
                }
                // This thread's next operation lets the epoch advance too.
                me.pin().flush();
            }
        });
        assert!(pods.remove("a", &epoch, &me.pin()));
        let b = maintain(&pods, &epoch, &me, &node);
        inserter.join().unwrap();
        if b == Some(PodId(0)) {
            REUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // "b" inserted nothing: an entry for id 0 is a's, misattributed.
            assert_eq!(
                node.pods.find(0),
                None,
                "b took an id a's insert still wrote"
            );
            assert_eq!(pods.blocks(0), 0);
        }
        drop(me);
        epoch.reclaim_ready();
    });
    // Not vacuous: some schedules do reuse the id.
    assert!(REUSED.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// Models a lookup that pinned after "a" was removed (so after the first
/// grace period began, which it need not hold back) and read a's entry before
/// the sweep purged it: `recycle`'s second grace period. Until it has passed,
/// such a reader may still check the id's liveness, so the id must not be
/// handed to "b" yet. Breaking that (freeing as soon as the blocks are gone)
/// lets the reader report b on a block b never inserted, and this fails.
#[test]
fn loom_recycled_id_waits_for_readers_of_old_entries() {
    static REUSED: StdAtomicUsize = StdAtomicUsize::new(0);
    pods_explorer().check(|| {
        let (pods, epoch, me, node) = pods_model();
        pods.add_blocks(0, 1);
        node.pods.add(0, 10);
        let reader = thread::spawn({
            let (pods, epoch, node) = (pods.clone(), epoch.clone(), node.clone());
            move || {
                let me = epoch.register();
                let pin = me.pin();
                // `Tree::lookup`: an entry counts if its pod is live.
                let mut named = Vec::new();
                for (pod, _) in node.pods.entries() {
                    if pods.is_live(pod) {
                        named.extend(pods.name(PodId(pod), &pin).map(str::to_owned));
                    }
                }
                named
            }
        });
        assert!(pods.remove("a", &epoch, &me.pin()));
        let b = maintain(&pods, &epoch, &me, &node);
        let named = reader.join().unwrap();
        if b == Some(PodId(0)) {
            REUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        assert!(
            !named.iter().any(|n| n == "b"),
            "a reader credited b with a's block: {named:?}"
        );
        drop(me);
        epoch.reclaim_ready();
    });
    assert!(REUSED.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// Two writers reserving room under a bound that fits only one: an observer
/// (`stats()`, the sweep) never sees the count past the bound, and exactly
/// one reservation goes through.
#[test]
fn loom_reserved_count_never_passes_its_bound() {
    use crate::stats::Counters;
    use loom::sync::atomic::AtomicI64;
    loom::model(|| {
        let count = Arc::new(AtomicI64::new(2));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let count = count.clone();
                thread::spawn(move || Counters::add_within(&count, 3, 5))
            })
            .collect();
        assert!(Counters::get(&count) <= 5);
        assert!(Counters::get(&count) <= 5);
        let through = writers.into_iter().map(|w| w.join().unwrap());
        assert_eq!(through.filter(|ok| *ok).count(), 1);
        assert_eq!(Counters::get(&count), 5);
    });
}

/// A pod's receipts: two agreeing receipts racing at a suspect pod's clear
/// report the clear once, and neither makes it suspect again. (A restart,
/// one plain store, racing a receipt is not modelled: loom 0.7 lets a
/// read-modify-write miss a plain store made before it, which the memory
/// model forbids.)
#[test]
fn loom_receipts_report_each_change_once() {
    use crate::receipts::{Change, PodReceipts, ReceiptRule};
    use prefix_proto::ReceiptOutcome::{Exact, Over};
    let rule = ReceiptRule {
        window: 8,
        suspect: 2,
        ..ReceiptRule::default()
    };
    loom::model(move || {
        let book = Arc::new(PodReceipts::new());
        book.record(Over, &rule, 1);
        assert_eq!(book.record(Over, &rule, 1).0, Some(Change::Suspect));
        assert_eq!(book.record(Exact, &rule, 1).0, None);
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let book = book.clone();
                thread::spawn(move || book.record(Exact, &rule, 2).0)
            })
            .collect();
        let changes: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            changes
                .iter()
                .filter(|c| **c == Some(Change::Cleared))
                .count(),
            1,
            "{changes:?}"
        );
        assert!(!changes.contains(&Some(Change::Suspect)), "{changes:?}");
        assert!(!book.standing(&rule, 2).suspect);
    });
}
