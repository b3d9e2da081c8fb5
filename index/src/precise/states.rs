//! What precise mode tells lookups of an engine-fed pod besides its
//! blocks: how far its answer can be trusted and how many lower cache tiers
//! it has. The map is published copy-on-write beside the trees
//! (`precise::registry::Registry::states`); `detail` reads and changes it.

use prefix_proto::PodView;

/// What an engine-fed pod's follower and its lower tiers tell lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PodState {
    /// The follower's view; `None` until it says (taken as exact).
    pub(crate) view: Option<PodView>,
    /// How many of the pod's lower tiers have held blocks: one past the
    /// highest tier index stored to (their hidden pods).
    pub(crate) tiers: u8,
}

/// Engine-fed pods' states by name.
pub(crate) type StateMap = crate::named::ByName<PodState>;
