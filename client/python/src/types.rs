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

/// Index statistics: the protocol's [`WireStats`], read through getters.
#[pyclass(frozen, module = "prefix_index")]
#[derive(Debug, Clone)]
pub struct Stats(pub(crate) WireStats);

#[pymethods]
impl Stats {
    #[getter]
    fn models(&self) -> u64 {
        self.0.models
    }
    #[getter]
    fn pods(&self) -> u64 {
        self.0.pods
    }
    #[getter]
    fn nodes(&self) -> u64 {
        self.0.nodes
    }
    #[getter]
    fn tree_blocks(&self) -> u64 {
        self.0.tree_blocks
    }
    #[getter]
    fn entries(&self) -> u64 {
        self.0.entries
    }
    #[getter]
    fn bytes(&self) -> u64 {
        self.0.bytes
    }

    fn __repr__(&self) -> String {
        let s = &self.0;
        format!(
            "Stats {{ models: {}, pods: {}, nodes: {}, tree_blocks: {}, entries: {}, bytes: {} }}",
            s.models, s.pods, s.nodes, s.tree_blocks, s.entries, s.bytes
        )
    }
}

/// One engine subscription and its state: the protocol's
/// [`wire::EngineState`], its subscription's fields and its status's read
/// through getters as one flat object.
#[pyclass(frozen, module = "prefix_index")]
#[derive(Debug, Clone)]
pub struct EngineState(pub(crate) wire::EngineState);

#[pymethods]
impl EngineState {
    #[getter]
    fn pod(&self) -> &str {
        &self.0.sub.pod
    }
    #[getter]
    fn model(&self) -> &str {
        &self.0.sub.model
    }
    #[getter]
    fn endpoint(&self) -> &str {
        &self.0.sub.endpoint
    }
    #[getter]
    fn replay(&self) -> Option<&str> {
        self.0.sub.replay.as_deref()
    }
    #[getter]
    fn block_size(&self) -> u32 {
        self.0.sub.block_size
    }
    #[getter]
    fn topic(&self) -> &str {
        &self.0.sub.topic
    }
    #[getter]
    fn media(&self) -> Vec<String> {
        self.0.sub.media.clone()
    }
    #[getter]
    fn connected(&self) -> bool {
        self.0.status.connected
    }
    #[getter]
    fn last_seq(&self) -> Option<u64> {
        self.0.status.last_seq
    }
    #[getter]
    fn events(&self) -> u64 {
        self.0.status.events
    }
    #[getter]
    fn blocks_stored(&self) -> u64 {
        self.0.status.blocks_stored
    }
    #[getter]
    fn blocks_removed(&self) -> u64 {
        self.0.status.blocks_removed
    }
    #[getter]
    fn resyncs(&self) -> u64 {
        self.0.status.resyncs
    }
    #[getter]
    fn replays(&self) -> u64 {
        self.0.status.replays
    }
    #[getter]
    fn orphaned(&self) -> u64 {
        self.0.status.orphaned
    }
    #[getter]
    fn decode_errors(&self) -> u64 {
        self.0.status.decode_errors
    }
    #[getter]
    fn lag_ms(&self) -> i64 {
        self.0.status.lag_ms
    }
    #[getter]
    fn last_error(&self) -> Option<&str> {
        self.0.status.last_error.as_deref()
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}
