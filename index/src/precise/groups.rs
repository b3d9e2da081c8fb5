//! Hybrid models: the KV-cache groups of one engine-fed pod, and the hit
//! they allow together.
//!
//! A model that mixes attention kinds (sliding-window layers beside full
//! ones, Mamba layers beside attention) keeps one KV-cache group per kind;
//! each group stores and evicts its own copies of the same blocks. vLLM's
//! `HybridKVCacheCoordinator.find_longest_cache_hit` reuses a prefix of `L`
//! blocks only where every group allows `L` (a fixed point: each group
//! lowers the candidate to the longest hit it allows, until none does), by
//! the rules of `single_type_kv_cache_manager.py`:
//! - full attention: every block before `L`;
//! - a sliding window of `W` tokens: the `cdiv(W - 1, block)` blocks just
//!   before `L` (all of them when `L` is shorter), since the window never
//!   looks further back;
//! - Mamba: the state at block `L - 1` alone.
//!
//! Here a group's rule is stated in **units**: engine blocks when they are
//! one or more of ours, our blocks when engine pages are smaller (a unit is
//! then held while all its pages are, so the rule asks for at least the
//! pages vLLM asks for). A kind the index does not model allows no hit: a
//! pod with such a group matches nothing, rather than something its engine
//! would refuse.

/// A KV-cache group's kind, as an engine's store names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Full attention (vLLM's `full_attention`, `mla_attention`,
    /// `sink_full_attention`; also `chunked_local_attention`, whose chunk
    /// size events do not carry: asking for every block is never more
    /// than it allows): a hit needs every block before it.
    Full,
    /// A sliding window of this many tokens (`sliding_window`,
    /// `sliding_window_mla`): a hit needs the blocks the window covers.
    Window(u32),
    /// A state-space group (`mamba`): a hit needs the state at its end.
    Mamba,
    /// Any other kind, or a group whose blocks the index cannot read (of
    /// another block size): the pod matches nothing while it has one.
    Unmodelled,
}

/// One KV-cache group as an engine event names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Group {
    /// The engine's index of the group (vLLM's `group_idx`).
    pub idx: u32,
    /// Its kind.
    pub kind: GroupKind,
}

impl Group {
    /// Group 0 of full attention: what a store that names no group is.
    pub const PLAIN: Group = Group {
        idx: 0,
        kind: GroupKind::Full,
    };
}

/// A group's rule for a hit of `L` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Units `0..L` held.
    Prefix,
    /// Units `L - w..L` held (`0..L` when `L < w`); `w >= 1`.
    Window(u32),
    /// Unit `L - 1` held.
    Last,
    /// Only `L = 0`.
    Never,
}

impl Rule {
    /// The rule of `kind` for units of `unit_tokens` tokens.
    pub(crate) fn of(kind: GroupKind, unit_tokens: u32) -> Rule {
        match kind {
            GroupKind::Full => Rule::Prefix,
            // vLLM's `cdiv(window - 1, block_size)`; a window of one token
            // or none still needs the block the hit ends in, as vLLM's
            // right-to-left scan does.
            GroupKind::Window(tokens) => {
                Rule::Window(tokens.saturating_sub(1).div_ceil(unit_tokens.max(1)).max(1))
            }
            GroupKind::Mamba => Rule::Last,
            GroupKind::Unmodelled => Rule::Never,
        }
    }

    /// Whether the rule is full attention's (a hit is then a held prefix,
    /// and stores hold their ancestors).
    pub(crate) fn is_prefix(self) -> bool {
        self == Rule::Prefix
    }

    /// The longest hit of at most `limit` units this rule allows, where
    /// `held(j)` says whether the group holds unit `j`. As vLLM's managers
    /// find it: full attention scans left to right, a window right to left
    /// for a long enough run, Mamba right to left for one held unit.
    pub(crate) fn longest(self, limit: u32, held: impl Fn(u32) -> bool) -> u32 {
        match self {
            Rule::Prefix => (0..limit).find(|&j| !held(j)).unwrap_or(limit),
            Rule::Window(w) => {
                let mut run = 0;
                for j in (0..limit).rev() {
                    if held(j) {
                        run += 1;
                        if run >= w {
                            return j + w;
                        }
                    } else {
                        run = 0;
                    }
                }
                // The run that reaches unit 0, shorter than the window.
                run
            }
            Rule::Last => (0..limit).rev().find(|&j| held(j)).map_or(0, |j| j + 1),
            Rule::Never => 0,
        }
    }
}

/// The longest hit of at most `limit` units every group allows, where
/// `held(g, j)` says whether group `g` (an index into `rules`) holds unit
/// `j`: vLLM's fixed point, each group lowering the candidate in turn until
/// a whole pass leaves it.
pub(crate) fn hit(rules: &[Rule], limit: u32, held: impl Fn(usize, u32) -> bool) -> u32 {
    let mut l = limit;
    loop {
        let start = l;
        for (g, rule) in rules.iter().enumerate() {
            if l == 0 {
                return 0;
            }
            l = rule.longest(l, |j| held(g, j));
        }
        if l == start {
            return l;
        }
    }
}

/// What lookups need of a hybrid pod: each group's rule, and the name of
/// the hidden pod whose entries are the group's blocks (none for the pod's
/// own, the first group's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupTable {
    pub(crate) groups: Vec<(Option<Box<str>>, Rule)>,
}

/// The character that marks a hidden pod's name: `{pod}\0{group}`. Names
/// from outside may not hold it ([`crate::PodError::Reserved`]).
pub(crate) const HIDDEN_MARK: char = '\0';

/// The lane and hidden-pod index of a pod's first lower cache tier
/// (`crate::detail`): past every group index an engine may name
/// (`max_engine_groups` is at most 64). Lower tier `t` (0-based, in the
/// subscription's order) is lane `LOWER + t`.
pub(crate) const LOWER: u32 = 64;

/// The most lower cache tiers one engine-fed pod may have apart from its
/// primary one ([`crate::MAX_LOWER_TIERS`]).
pub const MAX_LOWER_TIERS: u32 = 16;

/// The lane and hidden-pod index of lower tier `tier` (0-based).
pub(crate) fn lower_lane(tier: u32) -> u32 {
    LOWER + tier
}

/// Whether `idx` is the lane of a lower tier.
pub(crate) fn is_lower_lane(idx: u32) -> bool {
    (LOWER..LOWER + MAX_LOWER_TIERS).contains(&idx)
}

/// The name of the hidden pod holding group `idx` of `pod`.
pub(crate) fn hidden_name(pod: &str, idx: u32) -> String {
    format!("{pod}{HIDDEN_MARK}{idx}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(set: &[u32]) -> impl Fn(u32) -> bool + '_ {
        move |j| set.contains(&j)
    }

    #[test]
    fn each_rule_finds_the_longest_hit_it_allows() {
        let all: Vec<u32> = (0..10).collect();
        assert_eq!(Rule::Prefix.longest(10, held(&all)), 10);
        assert_eq!(Rule::Prefix.longest(10, held(&[0, 1, 2, 4])), 3);
        // A window of two units: the two before the hit.
        assert_eq!(Rule::Window(2).longest(10, held(&[6, 7])), 8);
        assert_eq!(
            Rule::Window(2).longest(10, held(&[0, 1, 2, 3, 4, 5, 6, 7])),
            8
        );
        assert_eq!(Rule::Window(2).longest(10, held(&[3, 5, 7, 9])), 0);
        // Shorter than the window from unit 0: the run from there.
        assert_eq!(Rule::Window(4).longest(10, held(&[0, 1, 5])), 2);
        assert_eq!(Rule::Last.longest(10, held(&[2, 5])), 6);
        assert_eq!(Rule::Last.longest(5, held(&[2, 5])), 3);
        assert_eq!(Rule::Never.longest(10, held(&all)), 0);
    }

    #[test]
    fn windows_count_in_units_as_vllm_rounds_them() {
        // vLLM: cdiv(window - 1, block).
        assert_eq!(Rule::of(GroupKind::Window(32), 16), Rule::Window(2));
        assert_eq!(Rule::of(GroupKind::Window(33), 16), Rule::Window(2));
        assert_eq!(Rule::of(GroupKind::Window(34), 16), Rule::Window(3));
        assert_eq!(Rule::of(GroupKind::Window(128), 64), Rule::Window(2));
        assert_eq!(Rule::of(GroupKind::Window(1), 16), Rule::Window(1));
        assert_eq!(Rule::of(GroupKind::Window(0), 16), Rule::Window(1));
    }

    #[test]
    fn the_hit_is_the_longest_every_group_allows() {
        // The hybrid row: full attention holds 10 blocks, a window
        // of 32 tokens (2 blocks of 16) lost blocks 8 and 9.
        let rules = [Rule::Prefix, Rule::Window(2)];
        let full: Vec<u32> = (0..10).collect();
        let window: Vec<u32> = (0..8).collect();
        let h = |g: usize, j: u32| {
            if g == 0 {
                full.contains(&j)
            } else {
                window.contains(&j)
            }
        };
        assert_eq!(hit(&rules, 10, h), 8);
        // Mamba's state at 6, a window that needs 4..6: 6; then full
        // attention lacking 5 brings it to 5, where neither holds: 0.
        let rules = [Rule::Last, Rule::Window(2), Rule::Prefix];
        let sets: [&[u32]; 3] = [&[5], &[3, 4, 5], &[0, 1, 2, 3, 4, 5]];
        assert_eq!(hit(&rules, 10, |g, j| sets[g].contains(&j)), 6);
        let sets: [&[u32]; 3] = [&[5], &[3, 4, 5], &[0, 1, 2, 3, 4]];
        assert_eq!(hit(&rules, 10, |g, j| sets[g].contains(&j)), 0);
        assert_eq!(hit(&[Rule::Prefix, Rule::Never], 10, |_, _| true), 0);
    }
}
