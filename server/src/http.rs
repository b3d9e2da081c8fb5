//! The small HTTP listener: `/metrics`, `/healthz`, `/readyz`. The probes
//! are also answered on the HTTP/JSON API's listener ([`probes`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prefix_index::Index;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// What the handlers read.
#[derive(Clone)]
pub struct Probe {
    /// The index, for sizes.
    pub index: Arc<Index>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Set once the server serves (at once, or once filled from a peer).
    pub ready: Arc<AtomicBool>,
    /// Cancelled when shutdown begins: not ready from then on.
    pub stopping: CancellationToken,
    /// Whether `/readyz` names the engines followed and not connected (on
    /// the metrics listener, whose `/metrics` names every pod anyway; not
    /// on the API's, whose clients may not be allowed to list engines).
    pub detail: bool,
}

/// The paths of the probes.
pub const PROBE_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The router: the metrics and the probes.
pub fn router(probe: Probe) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(probe.clone())
        .merge(probes(probe))
}

/// The probes alone: `/healthz` (the process answers) and `/readyz`
/// (serving, not filling, not stopping).
pub fn probes(probe: Probe) -> Router {
    Router::new()
        .route(PROBE_PATHS[0], get(|| async { "ok\n" }))
        .route(PROBE_PATHS[1], get(readyz))
        .with_state(probe)
}

async fn metrics(State(p): State<Probe>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        p.metrics.render(&p.index),
    )
}

/// Engines not connected that `/readyz` names.
const NAMED: usize = 10;

/// `ready` or `not ready` on its first line; when engines are followed
/// (and `detail` is on), a line of their counts and one per engine not
/// connected (up to [`NAMED`]). An engine down leaves the server ready: its other pods and
/// the gateways' own inserts still route.
async fn readyz(State(p): State<Probe>) -> impl IntoResponse {
    // Relaxed: a probe may see the change a moment late; nothing else is
    // ordered by this flag.
    let (status, mut body) = if p.ready.load(Ordering::Relaxed) && !p.stopping.is_cancelled() {
        (StatusCode::OK, String::from("ready\n"))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, String::from("not ready\n"))
    };
    if let Some(engines) = p.metrics.engines().filter(|_| p.detail) {
        let standing = engines.standing(NAMED);
        if standing.followed > 0 {
            body.push_str(&format!("{standing}\n"));
        }
    }
    (status, body)
}
