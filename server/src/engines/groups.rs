//! A store's KV-cache group as the index follows it (`prefix_index::Group`):
//! vLLM's `group_idx` and `kv_cache_spec_kind` (with the window of a
//! sliding one), read into the kinds whose hit rules the index models.

use prefix_events::Stored;
use prefix_index::{Group, GroupKind};

/// The group of store `s` on a subscription of `block_size`-token blocks.
///
/// - No kind (SGLang, older vLLM): full attention, as before groups.
/// - Full attention and its variants (`mla_attention`,
///   `sink_full_attention`), and `chunked_local_attention`, whose chunk size
///   events do not carry: every block before a hit is asked for, which is
///   never more than the engine asks for.
/// - `sliding_window` and `sliding_window_mla` with their window (without
///   one, as full attention, for the same reason).
/// - `mamba`.
/// - Any other kind, and a group after the first whose blocks are of
///   another size than the subscription's: not modelled, and the pod
///   matches nothing while it has one.
pub(super) fn group_of(s: &Stored, block_size: u32) -> Group {
    let idx = s.group.unwrap_or(0);
    let kind = match s.group_kind.as_deref() {
        _ if s.block_size != block_size => GroupKind::Unmodelled,
        None
        | Some("full_attention" | "mla_attention" | "sink_full_attention")
        | Some("chunked_local_attention") => GroupKind::Full,
        Some("sliding_window" | "sliding_window_mla") => match s.sliding_window {
            Some(w) => GroupKind::Window(w),
            None => GroupKind::Full,
        },
        Some("mamba") => GroupKind::Mamba,
        Some(_) => GroupKind::Unmodelled,
    };
    Group { idx, kind }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(group: Option<u32>, kind: Option<&str>, window: Option<u32>, size: u32) -> Stored {
        Stored {
            block_size: size,
            group,
            group_kind: kind.map(Into::into),
            sliding_window: window,
            ..Stored::default()
        }
    }

    #[test]
    fn kinds_read_into_the_rules_the_index_models() {
        let g = |group, kind, window, size| group_of(&stored(group, kind, window, size), 16);
        assert_eq!(g(None, None, None, 16), Group::PLAIN);
        assert_eq!(g(Some(0), Some("full_attention"), None, 16), Group::PLAIN);
        let one = |kind| Group { idx: 1, kind };
        assert_eq!(
            g(Some(1), Some("mla_attention"), None, 16),
            one(GroupKind::Full)
        );
        assert_eq!(
            g(Some(1), Some("chunked_local_attention"), None, 16),
            one(GroupKind::Full)
        );
        assert_eq!(
            g(Some(1), Some("sliding_window"), Some(4096), 16),
            one(GroupKind::Window(4096))
        );
        assert_eq!(
            g(Some(1), Some("sliding_window"), None, 16),
            one(GroupKind::Full)
        );
        assert_eq!(g(Some(1), Some("mamba"), None, 16), one(GroupKind::Mamba));
        for odd in ["cross_attention", "encoder_only_attention", "unknown", ""] {
            assert_eq!(g(Some(1), Some(odd), None, 16), one(GroupKind::Unmodelled));
        }
        // Another block size than the subscription's: not readable.
        assert_eq!(
            g(Some(1), Some("mamba"), None, 64),
            one(GroupKind::Unmodelled)
        );
    }
}
