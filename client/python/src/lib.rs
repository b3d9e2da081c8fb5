//! `prefix_index._native`: the Rust gateway client (`prefix-client`) for
//! Python, through PyO3.
//!
//! Every call exists twice, `lookup` (blocks the calling thread, the GIL
//! released) and `lookup_async` (an awaitable for asyncio, see [`aio`]);
//! both run the same future of the Rust client on one tokio runtime shared
//! by the process, so a Python gateway gets the Rust gateway's pipelining,
//! deadlines and reconnection. Errors become the exceptions of
//! [`PrefixIndexError`]'s family.

mod aio;
mod route;
mod types;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use prefix_client::key;
use prefix_client::wire::{ErrorCode, Limits, Op, Receipt, Reply, Subscription};
use prefix_client::{
    ClientConfig, ClientError, ConnectError, LookupResult as WireLookup, TlsConfig,
};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

use route::{AnyIndex, AnyRoute};
use types::{DetailResult, EngineState, LookupResult, Stats};

pyo3::create_exception!(
    prefix_index,
    PrefixIndexError,
    PyException,
    "Every error of this package."
);
pyo3::create_exception!(
    prefix_index,
    DeadlineExceeded,
    PrefixIndexError,
    "No answer within the call's deadline (the server may still apply it)."
);
pyo3::create_exception!(
    prefix_index,
    Disconnected,
    PrefixIndexError,
    "No connection to the server now; the client reconnects in the background."
);
pyo3::create_exception!(
    prefix_index,
    ServerError,
    PrefixIndexError,
    "The server refused the request: `code` and `name` are the protocol's error code."
);
pyo3::create_exception!(
    prefix_index,
    InvalidRequest,
    PrefixIndexError,
    "The request breaks a protocol limit and was not sent: `code` and `name` say which."
);
pyo3::create_exception!(
    prefix_index,
    ConnectFailed,
    PrefixIndexError,
    "The client could not be set up or connect (TLS material, address, handshake)."
);

/// A Python exception for a failed call.
fn call_error(e: ClientError) -> PyErr {
    let message = e.to_string();
    let coded = |err: PyErr, code: u16| {
        Python::attach(|py| {
            let v = err.value(py);
            let name = ErrorCode::from_u16(code).map(ErrorCode::name);
            let _ = v.setattr("code", code);
            let _ = v.setattr("name", name);
        });
        err
    };
    match &e {
        ClientError::Timeout(_) => DeadlineExceeded::new_err(message),
        ClientError::Disconnected { .. } => Disconnected::new_err(message),
        ClientError::Server { code, .. } => coded(ServerError::new_err(message), *code),
        ClientError::Invalid(w) => coded(InvalidRequest::new_err(message), w.code() as u16),
        ClientError::Protocol(_) => PrefixIndexError::new_err(message),
    }
}

fn connect_error(e: ConnectError) -> PyErr {
    ConnectFailed::new_err(e.to_string())
}

fn seconds(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!("{name} must be a positive number of seconds"))
        })
}

/// The limits requests are checked against before they are sent: the
/// server's defaults, with each entry of `given` (named as the server's
/// settings, `max_key_blocks` for `--max-key-blocks`) in its place, so a
/// client can follow a server configured otherwise.
fn limits(given: Option<HashMap<String, u64>>) -> PyResult<Limits> {
    let mut limits = Limits::default();
    for (name, value) in given.unwrap_or_default() {
        let usize_value = || {
            usize::try_from(value)
                .map_err(|_| PyValueError::new_err(format!("{name} is too large")))
        };
        match name.as_str() {
            "max_frame_bytes" => {
                limits.max_frame_bytes = u32::try_from(value)
                    .ok()
                    .filter(|&v| v <= prefix_client::wire::MAX_FRAME_CEILING)
                    .ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "max_frame_bytes is at most {}",
                            prefix_client::wire::MAX_FRAME_CEILING
                        ))
                    })?
            }
            "max_key_blocks" => limits.max_key_blocks = usize_value()?,
            "max_batch" => limits.max_batch = usize_value()?,
            "max_candidates" => limits.max_candidates = usize_value()?,
            "max_name_len" => limits.max_name_len = usize_value()?,
            other => {
                return Err(PyValueError::new_err(format!(
                    "no limit {other:?}: the limits are max_frame_bytes, max_key_blocks, max_batch, max_candidates and max_name_len"
                )))
            }
        }
    }
    Ok(limits)
}

/// The client's settings from the constructors' keyword arguments.
#[allow(clippy::too_many_arguments)]
fn config(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    server_name: &str,
    deadline: f64,
    connect_timeout: f64,
    idle_timeout: f64,
    given: Option<HashMap<String, u64>>,
) -> PyResult<ClientConfig> {
    let tls = match ca {
        Some(ca) => TlsConfig::from_files(&ca, cert.as_deref(), key.as_deref())
            .map_err(|e| ConnectFailed::new_err(e.to_string()))?,
        None if cert.is_some() || key.is_some() => {
            return Err(PyValueError::new_err("cert and key need ca"))
        }
        None => TlsConfig::default(),
    };
    Ok(ClientConfig {
        tls,
        server_name: server_name.into(),
        deadline: seconds("deadline", deadline)?,
        connect_timeout: seconds("connect_timeout", connect_timeout)?,
        idle_timeout: seconds("idle_timeout", idle_timeout)?,
        limits: limits(given)?,
        ..ClientConfig::default()
    })
}

/// The process's runtime: clients' connections live on it, and blocking
/// calls and awaitables both run there. A forked child gets a runtime of
/// its own (the parent's threads do not exist in it).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: parking_lot::Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> =
        parking_lot::Mutex::new(None);
    let mut rt = RUNTIME.lock();
    match *rt {
        Some((pid, r)) if pid == std::process::id() => r,
        _ => {
            let r = tokio::runtime::Builder::new_multi_thread()
                .thread_name("prefix-index")
                .enable_all()
                .build()
                // Without threads or a timer there is no client at all.
                .expect("starting the prefix-index runtime");
            // One per process; a parent's, left in a child, is never used.
            let r: &'static tokio::runtime::Runtime = Box::leak(Box::new(r));
            *rt = Some((std::process::id(), r));
            r
        }
    }
}

/// Refuses a client made in another process: after `os.fork()` its
/// connection and tasks live in the parent only.
fn same_process(pid: u32) -> PyResult<()> {
    if pid == std::process::id() {
        Ok(())
    } else {
        Err(PrefixIndexError::new_err(
            "this client was made before os.fork(): make a new one in this process",
        ))
    }
}

/// Runs `fut` to completion with the GIL released.
fn block<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = Result<T, ClientError>> + Send,
) -> PyResult<T> {
    py.detach(|| runtime().block_on(fut)).map_err(call_error)
}

/// `fut`, which answers nothing, as an asyncio awaitable of the running
/// loop that resolves to `None`.
fn awaitable_none<'py>(
    py: Python<'py>,
    fut: impl Future<Output = Result<(), ClientError>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    aio::awaitable(py, runtime(), fut, |py, out| {
        out.map_err(call_error)?;
        Ok(py.None())
    })
}

/// `fut` as an asyncio awaitable of the running loop.
fn awaitable<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = Result<T, ClientError>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    use pyo3::IntoPyObjectExt;
    aio::awaitable(py, runtime(), fut, |py, out| {
        out.map_err(call_error)?.into_py_any(py)
    })
}

/// A lookup's candidates as the client takes them.
fn names(candidates: &Option<Vec<String>>) -> Option<Vec<&str>> {
    candidates
        .as_ref()
        .map(|c| c.iter().map(String::as_str).collect())
}

async fn lookup(
    ix: AnyIndex,
    model: String,
    key: Vec<u64>,
    candidates: Option<Vec<String>>,
) -> Result<LookupResult, ClientError> {
    let found = ix.lookup(&model, &key, names(&candidates).as_deref()).await;
    found.map(LookupResult::from)
}

/// A detailed lookup: each pod with its lower-tier run and view.
async fn lookup_detail(
    ix: AnyIndex,
    model: String,
    key: Vec<u64>,
    candidates: Option<Vec<String>>,
) -> Result<DetailResult, ClientError> {
    let found = ix
        .lookup_detail(&model, &key, names(&candidates).as_deref())
        .await;
    found.map(DetailResult::from)
}

/// Lookups of several keys in one request (per server), answered in
/// order; the first refused one fails the call.
async fn lookup_many(
    ix: AnyIndex,
    model: String,
    keys: Vec<Vec<u64>>,
    candidates: Option<Vec<String>>,
) -> Result<Vec<LookupResult>, ClientError> {
    let ops: Vec<Op> = keys
        .into_iter()
        .map(|key| Op::Lookup {
            model: model.clone(),
            key,
            candidates: candidates.clone(),
        })
        .collect();
    ix.batch(ops)
        .await?
        .into_iter()
        .map(|r| match r {
            Reply::Lookup {
                key_blocks,
                matches,
            } => Ok(LookupResult::from(WireLookup {
                key_blocks,
                matches,
            })),
            Reply::Error { code, message } => Err(ClientError::Server { code, message }),
            other => Err(ClientError::Protocol(format!(
                "a lookup answered {other:?}"
            ))),
        })
        .collect()
}

/// The calls of [`Client`] and [`Cluster`], each blocking and awaitable.
#[pyclass(subclass, frozen, module = "prefix_index")]
pub struct Index {
    index: AnyIndex,
    /// The process the client was made in.
    pid: u32,
}

impl Index {
    /// The operations, if this process made them.
    fn index(&self) -> PyResult<AnyIndex> {
        same_process(self.pid)?;
        Ok(self.index.clone())
    }
}

/// The methods of [`Index`], each defined once and made twice: `name`
/// blocks the calling thread (the GIL released) and `name_async` returns
/// an asyncio awaitable, both running the same future. Each definition
/// gives its Python signature, its arguments, what it answers and, after
/// `=>`, how the awaitable hands the answer to Python ([`awaitable`], or
/// [`awaitable_none`] for a call that answers `None`), then a block that
/// makes the future.
macro_rules! calls {
    ($(
        $(#[doc = $doc:literal])*
        $(#[pyo3($($sig:tt)*)])?
        fn $name:ident, $name_async:ident(
            &$self:ident $(, $arg:ident: $ty:ty)* $(,)?
        ) -> $out:ty => $hand:ident $make:block
    )*) => {
        #[pymethods]
        impl Index {
            $(
                $(#[doc = $doc])*
                $(#[pyo3($($sig)*)])?
                #[allow(clippy::too_many_arguments)]
                fn $name(&$self, py: Python<'_>, $($arg: $ty),*) -> PyResult<$out> {
                    block(py, $make)
                }

                #[doc = concat!("Awaitable [`Index::", stringify!($name), "`].")]
                $(#[pyo3($($sig)*)])?
                #[allow(clippy::too_many_arguments)]
                fn $name_async<'py>(
                    &$self,
                    py: Python<'py>,
                    $($arg: $ty),*
                ) -> PyResult<Bound<'py, PyAny>> {
                    $hand(py, $make)
                }
            )*
        }
    };
}

calls! {
    /// Each pod's matched leading blocks of `key` (block hashes).
    #[pyo3(signature = (model, key, candidates=None))]
    fn lookup, lookup_async(
        &self,
        model: String,
        key: Vec<u64>,
        candidates: Option<Vec<String>>,
    ) -> LookupResult => awaitable {
        lookup(self.index()?, model, key, candidates)
    }

    /// Lookups of several keys in one request: what a gateway placing many
    /// prompts at once sends, at a fraction of the per-call cost.
    #[pyo3(signature = (model, keys, candidates=None))]
    fn lookup_many, lookup_many_async(
        &self,
        model: String,
        keys: Vec<Vec<u64>>,
        candidates: Option<Vec<String>>,
    ) -> Vec<LookupResult> => awaitable {
        lookup_many(self.index()?, model, keys, candidates)
    }

    /// A lookup by token ids, hashed here in blocks of `block_tokens`,
    /// with the request's identity ([`token_key`]).
    #[pyo3(signature = (model, tokens, candidates=None, block_tokens=16, *, cache_salt=None, mm_items=None, prompt_embeds=None))]
    fn lookup_tokens, lookup_tokens_async(
        &self,
        model: String,
        tokens: Vec<u32>,
        candidates: Option<Vec<String>>,
        block_tokens: usize,
        cache_salt: Option<String>,
        mm_items: Option<Vec<(String, u32, u32)>>,
        prompt_embeds: Option<Vec<Vec<u8>>>,
    ) -> LookupResult => awaitable {
        let id = identity(cache_salt, mm_items, prompt_embeds);
        let key = key::token_key_with(&tokens, block_tokens, &id);
        lookup(self.index()?, model, key, candidates)
    }

    /// As `lookup`, each pod with the run of blocks a lower cache tier
    /// holds after its match and how far its answer can be trusted.
    #[pyo3(signature = (model, key, candidates=None))]
    fn lookup_detail, lookup_detail_async(
        &self,
        model: String,
        key: Vec<u64>,
        candidates: Option<Vec<String>>,
    ) -> DetailResult => awaitable {
        lookup_detail(self.index()?, model, key, candidates)
    }

    /// Records that `pod` holds every prefix of `key`.
    fn insert, insert_async(
        &self,
        model: String,
        key: Vec<u64>,
        pod: String,
    ) -> () => awaitable_none {
        let ix = self.index()?;
        async move { ix.insert(&model, &key, &pod).await }
    }

    /// Reports what `pod`'s engine reused of a request routed there:
    /// `cached_tokens` (vLLM's `usage.prompt_tokens_details.cached_tokens`)
    /// against `predicted_blocks`, the blocks the lookup of `key` answered
    /// for `pod` when the request was routed. `prompt_tokens` is the
    /// prompt's length in tokens, when known (an engine never reuses a
    /// prompt's last token).
    #[pyo3(signature = (model, key, pod, predicted_blocks, cached_tokens, prompt_tokens=None))]
    fn receipt, receipt_async(
        &self,
        model: String,
        key: Vec<u64>,
        pod: String,
        predicted_blocks: u32,
        cached_tokens: u32,
        prompt_tokens: Option<u32>,
    ) -> () => awaitable_none {
        let ix = self.index()?;
        let receipt = Receipt {
            model,
            pod,
            key,
            prompt_tokens,
            predicted_blocks,
            cached_tokens,
        };
        async move { ix.receipt(receipt).await }
    }

    /// Forgets a pod everywhere; whether it was there.
    fn remove_pod, remove_pod_async(&self, pod: String) -> bool => awaitable {
        let ix = self.index()?;
        async move { ix.remove_pod(&pod).await }
    }

    /// Sets a pod's KV-cache capacity in blocks.
    fn set_pod_capacity, set_pod_capacity_async(
        &self,
        pod: String,
        blocks: u64,
    ) -> () => awaitable_none {
        let ix = self.index()?;
        async move { ix.set_pod_capacity(&pod, blocks).await }
    }

    /// Index statistics (summed over a cluster's servers).
    fn stats, stats_async(&self) -> Stats => awaitable {
        let ix = self.index()?;
        async move { ix.stats().await.map(Stats) }
    }

    /// A round trip to the server (every server of a cluster).
    fn ping, ping_async(&self) -> () => awaitable_none {
        let ix = self.index()?;
        async move { ix.ping().await }
    }
}

/// A connection to one server.
#[pyclass(extends = Index, frozen, module = "prefix_index")]
pub struct Client {
    client: prefix_client::Client,
    /// The process the client was made in.
    pid: u32,
}

impl Client {
    /// The client, if this process made it.
    fn client(&self) -> PyResult<prefix_client::Client> {
        same_process(self.pid)?;
        Ok(self.client.clone())
    }
}

#[pymethods]
impl Client {
    /// Connects to `address` (host:port), trusting the PEM CA `ca` (the
    /// server's `cert.pem`), with a client certificate for mutual TLS if
    /// given. Each call waits at most `deadline` seconds. Requests are
    /// checked against the server's default limits before they are sent;
    /// `limits` gives a server's own (`{"max_key_blocks": 4096}` for
    /// `--max-key-blocks 4096`).
    #[new]
    #[pyo3(signature = (address, *, ca=None, cert=None, key=None, server_name="localhost", deadline=0.002, connect_timeout=5.0, idle_timeout=5.0, limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: &str,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        server_name: &str,
        deadline: f64,
        connect_timeout: f64,
        idle_timeout: f64,
        limits: Option<HashMap<String, u64>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        // A name is resolved again before every reconnection (a restarted
        // pod may come back at another address).
        let server = prefix_client::ServerAddr::from(address);
        let cfg = config(
            ca,
            cert,
            key,
            server_name,
            deadline,
            connect_timeout,
            idle_timeout,
            limits,
        )?;
        let client = py
            .detach(|| runtime().block_on(prefix_client::Client::connect(server, cfg)))
            .map_err(connect_error)?;
        Ok(PyClassInitializer::from(Index {
            index: AnyRoute::of(&client),
            pid: std::process::id(),
        })
        .add_subclass(Client {
            client,
            pid: std::process::id(),
        }))
    }

    /// Follows an inference engine's KV-cache events (precise mode).
    #[pyo3(signature = (pod, model, endpoint, *, replay=None, block_size=16, topic="", media=Subscription::default_media()))]
    #[allow(clippy::too_many_arguments)]
    fn subscribe_engine(
        &self,
        py: Python<'_>,
        pod: String,
        model: String,
        endpoint: String,
        replay: Option<String>,
        block_size: u32,
        topic: &str,
        media: Vec<String>,
    ) -> PyResult<()> {
        let sub = Subscription {
            pod,
            model,
            endpoint,
            replay,
            block_size,
            topic: topic.into(),
            media,
        };
        let c = self.client()?;
        block(py, async move { c.subscribe_engine(sub).await })
    }

    /// Stops following a pod's engine (the pod is removed); whether it was
    /// followed.
    fn unsubscribe_engine(&self, py: Python<'_>, pod: String) -> PyResult<bool> {
        let c = self.client()?;
        block(py, async move { c.unsubscribe_engine(&pod).await })
    }

    /// Every engine followed, with its state.
    fn list_engines(&self, py: Python<'_>) -> PyResult<Vec<EngineState>> {
        let c = self.client()?;
        let list = block(py, async move { c.list_engines().await })?;
        Ok(list.into_iter().map(EngineState).collect())
    }

    /// Whether the connection is up now.
    fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    /// Closes the connection; later calls fail.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.client()?;
        py.detach(|| runtime().block_on(c.close()));
        Ok(())
    }
}

/// Several servers, each model placed on one of them by rendezvous hashing
/// (the same placement in every gateway; `docs/protocol.md`).
#[pyclass(extends = Index, frozen, module = "prefix_index")]
pub struct Cluster {
    /// The servers' names, in the order given.
    names: Vec<String>,
    /// Servers per model.
    replicas: usize,
}

#[pymethods]
impl Cluster {
    /// `servers` pairs each server's stable name (its placement key) with
    /// its address; each model lives on `replicas` of them (writes to all,
    /// reads from one, failing over). The other arguments are [`Client`]'s.
    /// Connects to every server before returning.
    #[new]
    #[pyo3(signature = (servers, *, replicas=1, ca=None, cert=None, key=None, server_name="localhost", deadline=0.002, connect_timeout=5.0, idle_timeout=5.0, limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: Vec<(String, String)>,
        replicas: usize,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        server_name: &str,
        deadline: f64,
        connect_timeout: f64,
        idle_timeout: f64,
        limits: Option<HashMap<String, u64>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let servers: Vec<(String, prefix_client::ServerAddr)> = servers
            .into_iter()
            .map(|(name, addr)| (name, addr.into()))
            .collect();
        let names = servers.iter().map(|(n, _)| n.clone()).collect();
        let cfg = config(
            ca,
            cert,
            key,
            server_name,
            deadline,
            connect_timeout,
            idle_timeout,
            limits,
        )?;
        let replication = prefix_client::Replication {
            replicas,
            ..Default::default()
        };
        let cluster = py
            .detach(|| {
                runtime().block_on(prefix_client::Cluster::connect_replicated(
                    &servers,
                    replication,
                    cfg,
                ))
            })
            .map_err(connect_error)?;
        Ok(PyClassInitializer::from(Index {
            index: AnyRoute::of(&cluster),
            pid: std::process::id(),
        })
        .add_subclass(Cluster { names, replicas }))
    }

    /// The name of the server `model` is placed on (its first replica).
    fn server_for(&self, model: &str) -> String {
        // `Cluster::connect` refuses an empty list: `place` finds one.
        let i = prefix_client::place(model, &self.names).unwrap_or(0);
        self.names[i].clone()
    }

    /// The names of `model`'s replicas, highest ranked first.
    fn replicas_of(&self, model: &str) -> Vec<String> {
        prefix_client::replicas(model, &self.names, self.replicas)
            .into_iter()
            .map(|i| self.names[i].clone())
            .collect()
    }
}

// Python signatures show a default only when it is a literal: these are
// the defaults of the key rules and of a subscription, written out.
const _: () = assert!(
    key::TEXT_BLOCK_BYTES == 64
        && key::TOKEN_BLOCK_TOKENS == 16
        && Subscription::DEFAULT_BLOCK_SIZE == 16
);

/// The key of a text prompt: one hash per full `block_bytes` bytes of its
/// UTF-8 encoding.
#[pyfunction]
#[pyo3(signature = (text, block_bytes=64))]
fn text_key(text: &str, block_bytes: usize) -> Vec<u64> {
    key::text_key(text, block_bytes)
}

/// The key of a token-id prompt: one hash per full `block_tokens` ids,
/// each block's hash seeded by its identity beyond the ids: the request's
/// `cache_salt`, its multimodal items as `(identifier, offset, length)` in
/// token positions, and its per-block prompt-embeds digests.
#[pyfunction]
#[pyo3(signature = (tokens, block_tokens=16, *, cache_salt=None, mm_items=None, prompt_embeds=None))]
fn token_key(
    tokens: Vec<u32>,
    block_tokens: usize,
    cache_salt: Option<String>,
    mm_items: Option<Vec<(String, u32, u32)>>,
    prompt_embeds: Option<Vec<Vec<u8>>>,
) -> Vec<u64> {
    let id = identity(cache_salt, mm_items, prompt_embeds);
    key::token_key_with(&tokens, block_tokens, &id)
}

/// A request's identity from the keyword arguments.
fn identity(
    cache_salt: Option<String>,
    mm_items: Option<Vec<(String, u32, u32)>>,
    prompt_embeds: Option<Vec<Vec<u8>>>,
) -> key::Identity {
    key::Identity {
        cache_salt,
        mm_items: mm_items
            .unwrap_or_default()
            .into_iter()
            .map(|(identifier, offset, length)| key::MmItem {
                identifier,
                offset,
                length,
            })
            .collect(),
        prompt_embeds,
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Index>()?;
    m.add_class::<Client>()?;
    m.add_class::<Cluster>()?;
    m.add_class::<LookupResult>()?;
    m.add_class::<DetailResult>()?;
    m.add_class::<Stats>()?;
    m.add_class::<EngineState>()?;
    m.add_function(wrap_pyfunction!(text_key, m)?)?;
    m.add_function(wrap_pyfunction!(token_key, m)?)?;
    m.add("PrefixIndexError", py.get_type::<PrefixIndexError>())?;
    m.add("DeadlineExceeded", py.get_type::<DeadlineExceeded>())?;
    m.add("Disconnected", py.get_type::<Disconnected>())?;
    m.add("ServerError", py.get_type::<ServerError>())?;
    m.add("InvalidRequest", py.get_type::<InvalidRequest>())?;
    m.add("ConnectFailed", py.get_type::<ConnectFailed>())?;
    Ok(())
}
