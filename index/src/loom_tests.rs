//! Loom models of the node-level protocols: the slot handshakes of `slots` and
//! the publish/grow/retire protocol of `children`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release -p prefix-index --lib loom`.
//!
//! Retired memory is freed after the threads join; the epoch scheme that
//! decides *when* it may be freed is crossbeam-epoch's, tested by its authors.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::children::{Children, Keyed};
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
    // Relaxed on purpose: only the table's Release publication orders it.
    c.payload.store(key * 10, Ordering::Relaxed);
    Box::into_raw(c)
}

struct Shared(Children<Child>);
// SAFETY: test wrapper; the children are leaked until the end of the model.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// Publication and growth: a reader racing with an insert that grows the table
/// always finds the child that was there before, and finds the new child either
/// fully initialised or not at all.
#[test]
fn loom_publish_and_grow() {
    loom::model(|| {
        let table = Arc::new(Shared(Children::new()));
        let first = child(1);
        // SAFETY: no other thread yet; `first` is valid.
        assert!(unsafe { table.0.insert(first, 0) }.1.is_none());
        let t = table.clone();
        let reader = thread::spawn(move || {
            // SAFETY: children stay valid until after the join.
            let a = unsafe { t.0.get(1, 0) };
            assert!(!a.is_null(), "an old child went missing during growth");
            // SAFETY: as above.
            let b = unsafe { t.0.get(2, 0) };
            if !b.is_null() {
                // SAFETY: as above.
                assert_eq!(unsafe { (*b).payload.load(Ordering::Relaxed) }, 20);
            }
        });
        let second = child(2);
        // Growth retires the old table, freed only after the reader joined.
        // SAFETY: the only writer; `second` is valid.
        let (_, retired) = unsafe { table.0.insert(second, 0) };
        reader.join().unwrap();
        // SAFETY: the reader is gone; we own everything.
        unsafe {
            if let Some(old) = retired {
                old.free();
            }
            table.0.free_table();
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
        let table = Arc::new(Shared(Children::new()));
        let (old, new) = (child(5), child(5));
        // Relaxed: ordered by the Release publication in `replace`.
        // SAFETY: `new` is valid and private until published.
        unsafe { (*new).payload.store(99, Ordering::Relaxed) };
        // SAFETY: single writer; `old` valid.
        unsafe { table.0.insert(old, 0) };
        let t = table.clone();
        let reader = thread::spawn(move || {
            // SAFETY: children stay valid until after the join.
            let p = unsafe { t.0.get(5, 0) };
            if !p.is_null() {
                // SAFETY: as above.
                let v = unsafe { (*p).payload.load(Ordering::Relaxed) };
                assert!(v == 50 || v == 99, "torn child: {v}");
            }
        });
        // SAFETY: single writer, valid pointers.
        unsafe {
            assert!(table.0.replace(old, new, 0));
            assert!(table.0.remove(new, 0));
        }
        reader.join().unwrap();
        // SAFETY: the reader is gone.
        unsafe {
            table.0.free_table();
            drop(Box::from_raw(old));
            drop(Box::from_raw(new));
        }
    });
}
