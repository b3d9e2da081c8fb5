//! Awaitables for asyncio, answered without the GIL on the answering thread.
//!
//! A call made from a coroutine runs on the process's tokio runtime like a
//! blocking one. When it finishes, the tokio thread does not take the GIL
//! (it would wait for the event loop's thread to let go of it, up to
//! Python's switch interval): it queues the outcome on the loop's
//! [`Bridge`] and, if the queue was empty, writes one byte to a socket the
//! loop watches (`loop.add_reader`). The loop's thread, which holds the GIL
//! anyway, then drains every queued outcome at once and resolves the
//! futures. One bridge per event loop, found through a weak map, so a
//! closed loop takes its bridge (and its sockets) with it.

use std::collections::HashMap;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCFunction, PyDict, PyTuple};

/// A finished call's outcome, made a Python object on the loop's thread.
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// What connects the runtime's threads to one event loop.
struct Bridge {
    /// Written (one byte) when outcomes wait and none did before.
    wake: UnixStream,
    /// The loop's end: readable when outcomes wait.
    woken: UnixStream,
    /// Outcomes not yet handed to their futures.
    done: Mutex<Vec<(u64, Outcome)>>,
    /// The futures of calls in flight, touched with the GIL held.
    futures: Mutex<HashMap<u64, Py<PyAny>>>,
}

impl Bridge {
    fn new() -> std::io::Result<Bridge> {
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        Ok(Bridge {
            wake,
            woken,
            done: Mutex::new(Vec::new()),
            futures: Mutex::new(HashMap::new()),
        })
    }

    /// Queues an outcome; wakes the loop if nothing was queued (a queue
    /// that was not empty has its wake-up on the way).
    fn finish(&self, id: u64, outcome: Outcome) {
        let first = {
            let mut done = self.done.lock();
            done.push((id, outcome));
            done.len() == 1
        };
        if first {
            // A full socket buffer already holds a wake-up: nothing lost.
            let _ = (&self.wake).write(&[1]);
        }
    }

    /// On the loop's thread: empties the socket, then resolves every queued
    /// future. The socket is read first, so an outcome queued meanwhile
    /// either is taken below or writes a new byte.
    fn drain(&self, py: Python<'_>) {
        let mut buf = [0u8; 256];
        loop {
            match (&self.woken).read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let done = std::mem::take(&mut *self.done.lock());
        for (id, outcome) in done {
            let Some(fut) = self.futures.lock().remove(&id) else {
                continue;
            };
            let fut = fut.bind(py);
            // A cancelled future takes no result.
            if fut
                .call_method0("cancelled")
                .and_then(|c| c.is_truthy())
                .unwrap_or(true)
            {
                continue;
            }
            let set = match outcome(py) {
                Ok(v) => fut.call_method1("set_result", (v,)),
                Err(e) => fut.call_method1("set_exception", (e.value(py),)),
            };
            if let Err(e) = set {
                e.write_unraisable(py, Some(fut));
            }
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// `weakref.WeakKeyDictionary`: event loop → its bridge's holder.
static BRIDGES: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Holds a bridge for Python (the weak map's value and the reader's
/// callback keep it alive as long as the loop lives).
#[pyclass(frozen)]
struct BridgeHandle(Arc<Bridge>);

/// The running loop's bridge, made and registered on first use.
fn bridge_for(py: Python<'_>, event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<Bridge>> {
    let map = BRIDGES
        .get_or_try_init(py, || {
            py.import("weakref")?
                .getattr("WeakKeyDictionary")?
                .call0()
                .map(Bound::unbind)
        })?
        .bind(py);
    if let Some(h) = map
        .call_method1("get", (event_loop,))?
        .extract::<Option<Bound<'_, BridgeHandle>>>()?
    {
        return Ok(h.get().0.clone());
    }
    let bridge = Arc::new(Bridge::new().map_err(|e| {
        pyo3::exceptions::PyOSError::new_err(format!("cannot open the loop's wake-up socket: {e}"))
    })?);
    let for_reader = bridge.clone();
    let reader = callable(py, move |args| for_reader.drain(args.py()))?;
    event_loop.call_method1("add_reader", (bridge.woken.as_raw_fd(), reader))?;
    map.set_item(event_loop, BridgeHandle(bridge.clone()))?;
    Ok(bridge)
}

/// `fut` as a future of the running asyncio loop, resolved through its
/// bridge with `convert`'s object.
pub fn awaitable<'py, T: Send + 'static>(
    py: Python<'py>,
    runtime: &tokio::runtime::Runtime,
    fut: impl Future<Output = T> + Send + 'static,
    convert: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let bridge = bridge_for(py, &event_loop)?;
    let future = event_loop.call_method0("create_future")?;
    // Relaxed: ids only need to be distinct.
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    bridge.futures.lock().insert(id, future.clone().unbind());
    let for_task = bridge.clone();
    let task = runtime.spawn(async move {
        let out = fut.await;
        for_task.finish(id, Box::new(move |py| convert(py, out)));
    });
    // A cancelled awaitable stops its call (a request already sent may
    // still be applied by the server) and lets go of its future, so a loop
    // closed with calls pending is not kept alive by them.
    let abort = task.abort_handle();
    let on_done = callable(py, move |args| {
        let cancelled = args
            .get_item(0)
            .and_then(|f| f.call_method0("cancelled"))
            .and_then(|c| c.is_truthy())
            .unwrap_or(false);
        if cancelled {
            abort.abort();
            bridge.futures.lock().remove(&id);
        }
    })?;
    future.call_method1("add_done_callback", (on_done,))?;
    Ok(future)
}

/// A Python function that calls `f` with its positional arguments (and
/// ignores keyword arguments).
fn callable<'py>(
    py: Python<'py>,
    f: impl Fn(&Bound<'_, PyTuple>) + Send + Sync + 'static,
) -> PyResult<Bound<'py, PyCFunction>> {
    PyCFunction::new_closure(
        py,
        None,
        None,
        move |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| f(args),
    )
}
