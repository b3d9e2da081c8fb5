//! The answers a Python caller gets: a lookup's matches, statistics and an
//! engine's state, each a frozen class over the client's own type.

use prefix_client::wire::{self, PodBlocks, PodDetail, WireStats};
use prefix_client::{DetailResult as WireDetail, LookupResult as WireLookup};
use pyo3::prelude::*;

/// The answer to a lookup.
#[pyclass(frozen, get_all, module = "prefix_index")]
#[derive(Debug, Clone)]
pub struct LookupResult {
    /// Blocks in the key the server looked up.
    key_blocks: u32,
    /// `(pod, blocks)` for every pod holding at least one leading block, by
    /// blocks descending, then pod name.
    matches: Vec<(String, u32)>,
}

#[pymethods]
impl LookupResult {
    fn __repr__(&self) -> String {
        format!(
            "LookupResult(key_blocks={}, matches={:?})",
            self.key_blocks, self.matches
        )
    }
}

impl From<WireLookup> for LookupResult {
    fn from(r: WireLookup) -> Self {
        LookupResult {
            key_blocks: r.key_blocks,
            matches: r
                .matches
                .into_iter()
                .map(|PodBlocks { pod, blocks }| (pod.as_str().to_owned(), blocks))
                .collect(),
        }
    }
}

/// The answer to a detailed lookup.
#[pyclass(frozen, get_all, module = "prefix_index")]
#[derive(Debug, Clone)]
pub struct DetailResult {
    /// Blocks in the key the server looked up.
    key_blocks: u32,
    /// `(pod, blocks, lower_blocks, view)` for the lookup's pods in its
    /// order, then pods held by a lower tier alone.
    matches: Vec<(String, u32, u32, &'static str)>,
}

#[pymethods]
impl DetailResult {
    fn __repr__(&self) -> String {
        format!(
            "DetailResult(key_blocks={}, matches={:?})",
            self.key_blocks, self.matches
        )
    }
}

impl From<WireDetail> for DetailResult {
    fn from(r: WireDetail) -> Self {
        DetailResult {
            key_blocks: r.key_blocks,
            matches: r
                .matches
                .into_iter()
                .map(
                    |PodDetail {
                         pod,
                         blocks,
                         lower_blocks,
                         view,
                         ..
                     }| {
                        (pod.as_str().to_owned(), blocks, lower_blocks, view.name())
                    },
                )
                .collect(),
        }
    }
}

/// Read-only attributes of a class over a wire value (its `.0`), each
/// read by an expression of that value, and the class's `repr`.
macro_rules! getters {
    ($class:ty, |$v:ident| { $($name:ident: $ty:ty = $read:expr,)* } repr $repr:expr) => {
        #[pymethods]
        impl $class {
            $(
                #[getter]
                fn $name(&self) -> $ty {
                    let $v = &self.0;
                    $read
                }
            )*

            fn __repr__(&self) -> String {
                let $v = &self.0;
                $repr
            }
        }
    };
}

/// Index statistics: the protocol's [`WireStats`], read through getters.
#[pyclass(frozen, module = "prefix_index")]
#[derive(Debug, Clone)]
pub struct Stats(pub(crate) WireStats);

getters!(Stats, |s| {
    models: u64 = s.models,
    pods: u64 = s.pods,
    nodes: u64 = s.nodes,
    tree_blocks: u64 = s.tree_blocks,
    entries: u64 = s.entries,
    bytes: u64 = s.bytes,
} repr format!(
    "Stats {{ models: {}, pods: {}, nodes: {}, tree_blocks: {}, entries: {}, bytes: {} }}",
    s.models, s.pods, s.nodes, s.tree_blocks, s.entries, s.bytes
));

/// One engine subscription and its state: the protocol's
/// [`wire::EngineState`], its subscription's fields and its status's read
/// through getters as one flat object.
#[pyclass(frozen, module = "prefix_index")]
#[derive(Debug, Clone)]
pub struct EngineState(pub(crate) wire::EngineState);

getters!(EngineState, |e| {
    pod: &str = &e.sub.pod,
    model: &str = &e.sub.model,
    endpoint: &str = &e.sub.endpoint,
    replay: Option<&str> = e.sub.replay.as_deref(),
    block_size: u32 = e.sub.block_size,
    topic: &str = &e.sub.topic,
    media: Vec<String> = e.sub.media.clone(),
    connected: bool = e.status.connected,
    last_seq: Option<u64> = e.status.last_seq,
    events: u64 = e.status.events,
    blocks_stored: u64 = e.status.blocks_stored,
    blocks_removed: u64 = e.status.blocks_removed,
    resyncs: u64 = e.status.resyncs,
    replays: u64 = e.status.replays,
    orphaned: u64 = e.status.orphaned,
    decode_errors: u64 = e.status.decode_errors,
    lag_ms: i64 = e.status.lag_ms,
    last_error: Option<&str> = e.status.last_error.as_deref(),
} repr format!("{e:?}"));
