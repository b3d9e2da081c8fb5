use std::time::Duration;

use prefix_proto::{PodView, Receipt, ReceiptCounts, ReceiptOutcome};

use super::*;
use crate::{Index, IndexConfig};

const NOW: u64 = 1_700_000_000_000;

fn index(rule: ReceiptRule) -> Index {
    Index::new(IndexConfig {
        receipts: rule,
        ..IndexConfig::default()
    })
}

/// An index whose rule makes a pod suspect at `suspect` over-predicting
/// receipts in its window (0: never), every other setting the default.
fn index_suspecting_at(suspect: u32) -> Index {
    index(ReceiptRule {
        suspect,
        ..ReceiptRule::default()
    })
}

/// A receipt for `pod` of a 10-block key of a 200-token prompt: `predicted`
/// blocks promised, `reused` blocks (of 16 tokens) reused.
fn receipt(pod: &str, predicted: u32, reused: u32) -> Receipt {
    Receipt {
        model: "m".into(),
        pod: pod.into(),
        key: (1..=10).collect(),
        prompt_tokens: Some(200),
        predicted_blocks: predicted,
        cached_tokens: reused * 16,
    }
}

/// Receipt counts of `exact`, `over` and `under` outcomes.
fn outcomes(exact: u32, over: u32, under: u32) -> ReceiptCounts {
    ReceiptCounts { exact, over, under }
}

fn send(index: &Index, pod: &str, predicted: u32, reused: u32, now: u64) -> Recorded {
    index
        .record_receipt(&receipt(pod, predicted, reused), 16, now)
        .unwrap()
}

fn standing(index: &Index, pod: &str, now: u64) -> Standing {
    index.reader().receipts_of(pod, now).unwrap()
}

#[test]
fn the_window_counts_each_outcome() {
    let index = index(ReceiptRule::default());
    index.insert("m", &[1, 2], "a", NOW).unwrap();
    for _ in 0..6 {
        assert_eq!(
            send(&index, "a", 5, 5, NOW).judged.outcome,
            ReceiptOutcome::Exact
        );
    }
    for _ in 0..4 {
        assert_eq!(
            send(&index, "a", 5, 2, NOW).judged.outcome,
            ReceiptOutcome::Over
        );
    }
    let last = send(&index, "a", 2, 5, NOW);
    assert_eq!(last.judged.outcome, ReceiptOutcome::Under);
    let counts = outcomes(6, 4, 1);
    assert_eq!(last.counts, counts);
    assert_eq!(
        standing(&index, "a", NOW),
        Standing {
            counts,
            suspect: false
        }
    );
    assert_eq!(index.receipt_totals(), [("a".to_owned(), [6, 4, 1])]);
    // The window keeps the last `window` receipts.
    for _ in 0..40 {
        send(&index, "a", 5, 5, NOW);
    }
    assert_eq!(standing(&index, "a", NOW).counts, outcomes(31, 0, 0));
    assert_eq!(index.receipt_totals(), [("a".to_owned(), [46, 4, 1])]);
}

#[test]
fn over_predictions_make_a_pod_suspect_until_its_receipts_agree() {
    let rule = ReceiptRule {
        suspect: 3,
        window: 8,
        ..ReceiptRule::default()
    };
    let index = index(rule);
    index
        .insert("m", &(1..=10).collect::<Vec<_>>(), "a", NOW)
        .unwrap();
    let view = |now| {
        let r = index.reader();
        let d = r.lookup_detail("m", &(1..=10).collect::<Vec<_>>(), None, now);
        (d.matches[0].view, d.matches[0].receipts)
    };
    assert_eq!(send(&index, "a", 10, 2, NOW).change, None);
    assert_eq!(send(&index, "a", 10, 10, NOW).change, None);
    assert_eq!(send(&index, "a", 10, 2, NOW).change, None);
    assert_eq!(view(NOW).0, PodView::Gateway);
    // The third over-prediction in the window: suspect, once.
    assert_eq!(send(&index, "a", 10, 0, NOW).change, Some(Change::Suspect));
    assert_eq!(send(&index, "a", 10, 0, NOW).change, None);
    let (v, counts) = view(NOW);
    assert_eq!(v, PodView::Suspect);
    assert_eq!(counts, outcomes(1, 4, 0));
    // Two agreeing receipts are not enough; the third in a row ends it, and
    // the window restarts with them.
    assert_eq!(send(&index, "a", 10, 10, NOW).change, None);
    assert_eq!(send(&index, "a", 4, 6, NOW).change, None);
    assert_eq!(send(&index, "a", 10, 10, NOW).change, Some(Change::Cleared));
    let (v, counts) = view(NOW);
    assert_eq!(v, PodView::Gateway);
    assert_eq!(counts, outcomes(2, 0, 1));
    // One more over-prediction does not bring it back.
    assert_eq!(send(&index, "a", 10, 0, NOW).change, None);
    assert_eq!(view(NOW).0, PodView::Gateway);
}

#[test]
fn a_quiet_suspect_pod_is_suspect_no_more() {
    let rule = ReceiptRule {
        suspect: 2,
        quiet: Duration::from_secs(60),
        ..ReceiptRule::default()
    };
    let index = index(rule);
    index.insert("m", &[1], "a", NOW).unwrap();
    send(&index, "a", 10, 0, NOW);
    assert_eq!(send(&index, "a", 10, 0, NOW).change, Some(Change::Suspect));
    assert!(standing(&index, "a", NOW + 60_000).suspect);
    assert!(!standing(&index, "a", NOW + 60_001).suspect);
    // The next receipt restarts the window.
    let next = send(&index, "a", 10, 0, NOW + 61_000);
    assert_eq!(next.change, Some(Change::Cleared));
    assert_eq!(next.counts, outcomes(0, 1, 0));
    assert_eq!(
        send(&index, "a", 10, 0, NOW + 61_000).change,
        Some(Change::Suspect)
    );
}

#[test]
fn no_threshold_never_makes_a_pod_suspect() {
    let index = index_suspecting_at(0);
    index.insert("m", &[1], "a", NOW).unwrap();
    for _ in 0..64 {
        assert_eq!(send(&index, "a", 10, 0, NOW).change, None);
    }
    assert!(!standing(&index, "a", NOW).suspect);
}

#[test]
fn receipts_for_pods_the_index_lacks_are_refused() {
    let index = index(ReceiptRule::default());
    let unknown = index.record_receipt(&receipt("b", 1, 1), 16, NOW);
    assert!(matches!(unknown, Err(ReceiptRefusal::UnknownPod { .. })));
    index.insert("m", &[1], "b", NOW).unwrap();
    send(&index, "b", 10, 0, NOW);
    // Removed, then named again: a new pod with no receipts.
    assert!(index.remove_pod("b"));
    let late = index.record_receipt(&receipt("b", 1, 1), 16, NOW);
    assert!(matches!(late, Err(ReceiptRefusal::UnknownPod { .. })));
    index.insert("m", &[1], "b", NOW).unwrap();
    assert_eq!(standing(&index, "b", NOW).counts.total(), 0);
    let bad = Receipt {
        predicted_blocks: 11,
        ..receipt("b", 0, 0)
    };
    assert!(matches!(
        index.record_receipt(&bad, 16, NOW),
        Err(ReceiptRefusal::Bad(_))
    ));
}

#[test]
fn a_pod_named_in_a_removed_pods_slot_starts_with_no_receipts() {
    let index = index_suspecting_at(1);
    let id = |pod: &str| {
        let r = index.reader();
        let found = r.lookup("m", &[1], Some(&[pod]), NOW);
        found.matches[0].pod
    };
    index.insert("m", &[1], "b", NOW).unwrap();
    let old = id("b");
    assert_eq!(send(&index, "b", 10, 0, NOW).change, Some(Change::Suspect));
    assert!(index.remove_pod("b"));
    // The sweep frees the id after its two grace periods.
    for _ in 0..16 {
        index.sweep(NOW, usize::MAX);
    }
    index.insert("m", &[1], "c", NOW).unwrap();
    assert_eq!(id("c"), old, "the slot is reused");
    assert_eq!(standing(&index, "c", NOW), Standing::default());
    assert_eq!(index.receipt_totals(), []);
}

#[test]
fn a_restart_forgets_the_window_but_not_the_totals() {
    let index = index_suspecting_at(1);
    index.insert("m", &[1], "a", NOW).unwrap();
    assert_eq!(send(&index, "a", 10, 0, NOW).change, Some(Change::Suspect));
    assert!(index.restart_receipts("a"));
    assert_eq!(standing(&index, "a", NOW), Standing::default());
    assert_eq!(index.receipt_totals(), [("a".to_owned(), [0, 1, 0])]);
    assert!(!index.restart_receipts("z"));
}
