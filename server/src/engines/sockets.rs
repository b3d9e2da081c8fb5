//! The libzmq context precise mode's sockets come from, with room for as
//! many sockets as `max-engines` may need, and the socket setups shared by
//! the shards and the central collector.
//!
//! The `zmq` crate's context keeps libzmq's default of 1,023 sockets and
//! has no setter for it; [`Context`] is libzmq's context itself, sized
//! before its first socket (libzmq reads the limit then, once).

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::EngineConfig;

/// The name libzmq's threads of precise mode's context carry.
pub const ENGINE_ZMQ_THREADS: &str = "engine-zmq";

/// A libzmq context; each [`Socket`] made from it holds it alive.
#[derive(Clone)]
pub(crate) struct Context {
    raw: Arc<Raw>,
}

/// libzmq's context pointer, terminated when the last holder goes, and
/// whether its threads were started.
struct Raw(*mut c_void, std::sync::OnceLock<Result<(), zmq::Error>>);

// SAFETY: a libzmq context is thread-safe (zmq_ctx_new(3): "ØMQ contexts
// are thread safe and may be shared among as many application threads as
// necessary"); the pointer is only passed to libzmq.
unsafe impl Send for Raw {}
// SAFETY: as for `Send`.
unsafe impl Sync for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        // Every socket holds an `Arc` of this: none is left open, so
        // terminating does not wait on one (it retries if interrupted).
        loop {
            // SAFETY: the pointer came from `zmq_ctx_new` and is terminated
            // once, here, by the last holder.
            let rc = unsafe { zmq_sys::zmq_ctx_term(self.0) };
            if rc == 0 || zmq::Error::from_raw(errno()) != zmq::Error::EINTR {
                break;
            }
        }
    }
}

/// A socket, closed before the context it holds.
pub(crate) struct Socket {
    // Declared first: dropped (closed) before `_ctx`.
    socket: zmq::Socket,
    _ctx: Arc<Raw>,
}

impl std::ops::Deref for Socket {
    type Target = zmq::Socket;
    fn deref(&self) -> &zmq::Socket {
        &self.socket
    }
}

fn errno() -> i32 {
    // SAFETY: reads the calling thread's libzmq error number.
    unsafe { zmq_sys::zmq_errno() }
}

impl Context {
    /// A context that allows `max_sockets` sockets at once.
    pub(crate) fn new(max_sockets: usize) -> Result<Context, zmq::Error> {
        // SAFETY: creates a context; null on failure, checked below.
        let ctx = unsafe { zmq_sys::zmq_ctx_new() };
        if ctx.is_null() {
            return Err(zmq::Error::from_raw(errno()));
        }
        let raw = Raw(ctx, std::sync::OnceLock::new());
        let max = i32::try_from(max_sockets).unwrap_or(i32::MAX);
        // SAFETY: `ctx` is a live context with no socket yet, when libzmq
        // still takes this option.
        let rc = unsafe { zmq_sys::zmq_ctx_set(raw.0, zmq_sys::ZMQ_MAX_SOCKETS as _, max) };
        if rc != 0 {
            return Err(zmq::Error::from_raw(errno()));
        }
        Ok(Context { raw: Arc::new(raw) })
    }

    /// Starts libzmq's I/O and reaper threads, once, before the first
    /// socket (which would start them): from a thread named [`ENGINE_ZMQ_THREADS`].
    /// libzmq as built here names no thread, and a new thread takes its
    /// creator's name, so libzmq's threads are told apart by it (CPU time
    /// per thread, `top`).
    fn started(&self) -> Result<(), zmq::Error> {
        *self.raw.1.get_or_init(|| {
            let ctx = self.clone();
            std::thread::Builder::new()
                .name(ENGINE_ZMQ_THREADS.into())
                .spawn(move || ctx.raw_socket(zmq::PAIR).map(drop))
                .map_err(|_| zmq::Error::EAGAIN)?
                .join()
                .map_err(|_| zmq::Error::EFAULT)?
        })
    }

    /// A new socket of `kind`.
    pub(crate) fn socket(&self, kind: zmq::SocketType) -> Result<Socket, zmq::Error> {
        self.started()?;
        self.raw_socket(kind)
    }

    fn raw_socket(&self, kind: zmq::SocketType) -> Result<Socket, zmq::Error> {
        // SAFETY: `self.raw` is a live context (this `Arc` holds it).
        let sock = unsafe { zmq_sys::zmq_socket(self.raw.0, raw_kind(kind)? as _) };
        if sock.is_null() {
            return Err(zmq::Error::from_raw(errno()));
        }
        Ok(Socket {
            // SAFETY: `sock` is a socket libzmq just made, owned by nothing
            // else; the wrapper closes it once, when dropped, before the
            // context it is given (the field order of `Socket`).
            socket: unsafe { zmq::Socket::from_raw(sock) },
            _ctx: self.raw.clone(),
        })
    }
}

/// libzmq's number for the kinds of socket precise mode uses (the `zmq`
/// crate keeps its own mapping private).
fn raw_kind(kind: zmq::SocketType) -> Result<u32, zmq::Error> {
    Ok(match kind {
        zmq::PAIR => zmq_sys::ZMQ_PAIR,
        zmq::SUB => zmq_sys::ZMQ_SUB,
        zmq::REP => zmq_sys::ZMQ_REP,
        zmq::DEALER => zmq_sys::ZMQ_DEALER,
        _ => return Err(zmq::Error::EINVAL),
    })
}

/// Descriptors one libzmq socket of this build holds for its mailbox's
/// signal: 1 for an eventfd (Linux, libzmq built as `.cargo/config.toml`
/// asks), 2 for a socket pair. Seen once, from a socket's own descriptor,
/// so that a build without that file is counted as it is.
pub(crate) fn descriptors_per_socket() -> u64 {
    static SEEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEEN.get_or_init(|| {
        let seen = || -> Option<u64> {
            let ctx = zmq::Context::new();
            let socket = ctx.socket(zmq::PAIR).ok()?;
            let fd = socket.get_fd().ok()?;
            let what = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
            Some(match what.to_string_lossy().contains("eventfd") {
                true => 1,
                false => 2,
            })
        };
        // Where it cannot be seen (no /proc), the larger count.
        seen().unwrap_or(2)
    })
}

/// libzmq sockets one followed engine may hold at most: a SUB socket of
/// its own and its monitor's pair (an engine named by host name); an
/// engine at an address shares its shard's sockets instead.
pub(crate) const SOCKETS_PER_ENGINE: usize = 3;

/// The sockets precise mode may hold: each engine's, each shard's shared
/// sockets with their monitors, the replays under way, the central
/// collector's and slack for sockets closing.
pub(crate) fn max_sockets(cfg: &EngineConfig) -> usize {
    SOCKETS_PER_ENGINE
        .saturating_mul(cfg.max_engines)
        .saturating_add(cfg.max_replays)
        .saturating_add(64)
}

/// A socket of `kind` with the engine bounds of `cfg`: the largest message
/// (larger ones drop the connection) and the messages queued per
/// connection while its thread is busy.
pub(crate) fn bounded(
    ctx: &Context,
    kind: zmq::SocketType,
    cfg: &EngineConfig,
) -> Result<Socket, zmq::Error> {
    let socket = ctx.socket(kind)?;
    socket.set_maxmsgsize(i64::try_from(cfg.max_message_bytes).unwrap_or(i64::MAX))?;
    // Closing drops unsent requests at once: nothing here must outlive
    // its socket.
    socket.set_linger(0)?;
    socket.set_rcvhwm(i32::try_from(cfg.max_queued_messages).unwrap_or(i32::MAX))?;
    socket.set_reconnect_ivl(100)?;
    socket.set_reconnect_ivl_max(5_000)?;
    Ok(socket)
}

/// Names the monitor endpoints of sockets apart.
static MONITORS: AtomicUsize = AtomicUsize::new(0);

/// A socket and its monitor, whose events say which of its connections
/// are up.
pub(crate) struct Watched {
    pub(crate) socket: Socket,
    pub(crate) monitor: Socket,
}

impl Watched {
    /// Watches `socket` (before it connects, so that its first connection
    /// is seen too).
    pub(crate) fn new(ctx: &Context, socket: Socket) -> Result<Watched, zmq::Error> {
        // Relaxed: a name counter; only its uniqueness matters.
        let n = MONITORS.fetch_add(1, Ordering::Relaxed);
        let addr = format!("inproc://engine-monitor-{n}");
        socket.monitor(
            &addr,
            (zmq::SocketEvent::CONNECTED as u16 | zmq::SocketEvent::DISCONNECTED as u16) as i32,
        )?;
        let monitor = ctx.socket(zmq::PAIR)?;
        monitor.connect(&addr)?;
        Ok(Watched { socket, monitor })
    }
}

/// A connection coming up or going down, as a monitor tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// Up (connected) or down (disconnected).
    pub(crate) up: bool,
    /// The endpoint of the connection, as libzmq writes it
    /// (`tcp://127.0.0.1:5557`, the address resolved).
    pub(crate) endpoint: String,
}

/// A libzmq monitor message's event, if it is one of connecting or
/// disconnecting. Its first frame is the event number (u16, native order)
/// and a value (u32); its second the endpoint.
pub(crate) fn monitor_event(frames: &[Vec<u8>]) -> Option<Event> {
    let head = frames.first()?;
    let event = u16::from_ne_bytes([*head.first()?, *head.get(1)?]);
    let up = if event == zmq::SocketEvent::CONNECTED as u16 {
        true
    } else if event == zmq::SocketEvent::DISCONNECTED as u16 {
        false
    } else {
        return None;
    };
    let endpoint = frames
        .get(1)
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .unwrap_or_default();
    Some(Event { up, endpoint })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context sized past libzmq's default of 1,023 sockets holds that
    /// many and more; the `zmq` crate's own stops at its default.
    #[test]
    fn a_sized_context_holds_more_sockets_than_the_default() {
        // Each socket holds a descriptor (its mailbox).
        crate::descriptors::raise_open_files(4_000).unwrap();
        let ctx = Context::new(1_500).unwrap();
        let sockets: Vec<_> = (0..1_200).map(|_| ctx.socket(zmq::SUB).unwrap()).collect();
        assert_eq!(sockets.len(), 1_200);
        let default = zmq::Context::new();
        let mut held = Vec::new();
        let err = loop {
            match default.socket(zmq::SUB) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
        };
        assert_eq!(held.len(), zmq_sys::ZMQ_MAX_SOCKETS_DFLT as usize);
        assert_eq!(err, zmq::Error::EMFILE);
    }

    /// Set in the child process that measures.
    const MEASURE: &str = "PREFIX_INDEX_TEST_MEASURE_SOCKETS";

    /// The descriptors this process holds.
    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// A watched SUB socket and a replay's DEALER hold the descriptors
    /// `descriptors.rs` counts for them. Measured in a child process
    /// running this test alone, so that no other test opens or closes
    /// descriptors meanwhile.
    #[test]
    fn sockets_hold_the_descriptors_counted_for_them() {
        let (per_socket, per_watched) =
            (descriptors_per_socket(), crate::descriptors::per_watched());
        // This build's libzmq signals with eventfd where
        // `.cargo/config.toml` asks it to.
        if cfg!(all(
            target_os = "linux",
            any(target_arch = "x86_64", target_arch = "aarch64")
        )) {
            assert_eq!(per_socket, 1, "libzmq built without eventfd");
        }
        if std::env::var_os(MEASURE).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "engines::sockets::tests::sockets_hold_the_descriptors_counted_for_them",
                    "--nocapture",
                ])
                .env(MEASURE, "1")
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{said}");
            assert!(said.contains("1 passed"), "the child ran the test: {said}");
            return;
        }
        let cfg = EngineConfig::default();
        let ctx = Context::new(64).unwrap();
        // libzmq starts its threads (and their mailboxes) with the first
        // socket: made before counting, and kept (a closed socket's
        // descriptors are closed later, by libzmq's reaper thread).
        let _first = ctx.socket(zmq::PAIR).unwrap();
        let before = open_descriptors();
        let watched = Watched::new(&ctx, bounded(&ctx, zmq::SUB, &cfg).unwrap()).unwrap();
        let with_watched = open_descriptors();
        let dealer = bounded(&ctx, zmq::DEALER, &cfg).unwrap();
        let with_dealer = open_descriptors();
        let held = |from: usize, to: usize| to as i64 - from as i64;
        assert_eq!(
            held(before, with_watched),
            per_watched as i64,
            "SUB, monitor, PAIR"
        );
        assert_eq!(held(with_watched, with_dealer), per_socket as i64, "DEALER");
        drop((watched, dealer));
    }

    #[test]
    fn monitor_events_name_their_endpoint() {
        let mut head = (zmq::SocketEvent::CONNECTED as u16).to_ne_bytes().to_vec();
        head.extend_from_slice(&7u32.to_ne_bytes());
        let frames = vec![head, b"tcp://127.0.0.1:5557".to_vec()];
        assert_eq!(
            monitor_event(&frames),
            Some(Event {
                up: true,
                endpoint: "tcp://127.0.0.1:5557".into()
            })
        );
        let mut other = (zmq::SocketEvent::LISTENING as u16).to_ne_bytes().to_vec();
        other.extend_from_slice(&0u32.to_ne_bytes());
        assert_eq!(monitor_event(&[other]), None);
        assert_eq!(monitor_event(&[vec![1]]), None);
    }
}
