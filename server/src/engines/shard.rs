//! A shard: one thread that follows many engines, polling their sockets
//! together.
//!
//! **Sockets.** Each engine has a seat, decided as it is subscribed
//! (`seats`): a group of the shard (one SUB socket connected to many
//! engines at addresses, subscribed to every topic, with one monitor whose
//! events name the endpoint that connected or dropped; a message is told
//! apart by the address it came from, libzmq's `Peer-Address`, and its
//! topic), or a SUB socket and a monitor of its own for an engine named by
//! host name. A group's socket is opened with its first engine and closed
//! with its last.
//! A replay DEALER is opened when a replay is wanted and closed when it
//! ends, at most `max-engine-replays` at once over all shards; a replay
//! waiting for one holds the live stream back as any replay does.
//!
//! **Time.** The thread waits in `zmq::poll` for any socket or for a
//! command (a wake-up byte on a socket pair), at most the poll period; the
//! views, the stop tokens and the engines whose sockets failed are looked
//! at once a second ([`TICK`]), so idle engines cost no wake-ups.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use prefix_events::{parse_live, replay_request};
use slab::Slab;
use tokio_util::sync::CancellationToken;

use super::seats::{endpoint_addr, Routes, Seat};
use super::session::{Env, Session};
use super::sockets::{self, monitor_event, Context, Socket, Watched};
use super::stats::Problem;
use super::view::Pending;
use crate::memory::Releaser;

/// Messages taken from one socket before the others get a turn.
pub(super) const BURST: usize = 256;

/// How often views, stop tokens and failed sockets are looked at.
const TICK: Duration = Duration::from_secs(1);

/// How long an engine whose socket could not be opened or connected
/// waits before the next try.
const RETRY: Duration = Duration::from_secs(1);

/// What the server asks of a shard.
pub(super) enum Command {
    /// Follow this engine, from this seat.
    Add(Box<Session>, Seat),
    /// This pod's subscription was cancelled: drop it now.
    Remove(String),
}

/// The server's end of a shard: commands, each followed by a wake-up.
pub(super) struct Handle {
    commands: mpsc::Sender<Command>,
    wake: UnixStream,
}

impl Handle {
    /// Sends `command`; false if the shard has stopped.
    pub(super) fn send(&self, command: Command) -> bool {
        if self.commands.send(command).is_err() {
            return false;
        }
        // A full pipe already holds a wake-up the shard has yet to read.
        let _ = (&self.wake).write(&[1]);
        true
    }
}

/// Replays under way over all shards, against `max-engine-replays`.
#[derive(Debug, Default)]
pub(super) struct Replays {
    running: AtomicUsize,
}

/// One replay's share of [`Replays`], given back when dropped.
struct Permit(Arc<Replays>);

impl Replays {
    fn take(self: &Arc<Self>, max: usize) -> Option<Permit> {
        // Relaxed: a counter bounding sockets; no other memory is ordered
        // by it.
        self.running
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit(self.clone()))
    }

    /// Replays under way now.
    pub(super) fn running(&self) -> usize {
        // Relaxed: a statistic.
        self.running.load(Ordering::Relaxed)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Relaxed: see `Replays::take`.
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where an engine's live messages come from.
enum Place {
    /// A shared SUB socket, connected to this endpoint.
    Group { group: u64, addr: SocketAddr },
    /// A SUB socket of its own.
    Own(Watched),
    /// Nowhere yet: its socket failed; tried again at this time.
    Unplaced(Instant),
}

/// One engine: its session and its sockets.
struct Slot {
    session: Session,
    seat: Seat,
    place: Place,
    /// Its replay socket, while a replay is under way.
    dealer: Option<(Socket, Permit)>,
    /// Whether it waits in `waiting` for a replay permit.
    queued: bool,
}

/// A shared SUB socket and the engines it is connected to.
struct Group {
    watched: Watched,
    routes: Routes<usize>,
}

/// What a readable poll item is.
#[derive(Clone, Copy)]
enum Source {
    Wake,
    Group(u64),
    GroupMonitor(u64),
    Own(usize),
    OwnMonitor(usize),
    Dealer(usize),
}

impl Source {
    /// Whether it brings engine messages (live or replayed).
    fn carries_messages(&self) -> bool {
        matches!(self, Source::Group(_) | Source::Own(_) | Source::Dealer(_))
    }
}

/// One shard's thread state.
pub(super) struct Shard {
    env: Env,
    ctx: Context,
    commands: mpsc::Receiver<Command>,
    wake: UnixStream,
    slots: Slab<Slot>,
    by_pod: HashMap<String, usize>,
    /// Groups by their id (`seats`).
    groups: HashMap<u64, Group>,
    /// Slots with a socket of their own.
    own: HashSet<usize>,
    /// Slots with a replay socket or a replay sent: the ones with a
    /// deadline.
    replaying: HashSet<usize>,
    /// Slots whose replay waits for a permit, first come first served.
    waiting: VecDeque<usize>,
    replays: Arc<Replays>,
    next_tick: Instant,
    /// Views changed since the index was last given them.
    views: Pending,
}

impl Shard {
    /// A shard and the server's handle on it.
    pub(super) fn new(
        env: Env,
        ctx: Context,
        replays: Arc<Replays>,
    ) -> std::io::Result<(Shard, Handle)> {
        let (tx, rx) = mpsc::channel();
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let shard = Shard {
            env,
            ctx,
            commands: rx,
            wake: wake_rx,
            slots: Slab::new(),
            by_pod: HashMap::new(),
            groups: HashMap::new(),
            own: HashSet::new(),
            replaying: HashSet::new(),
            waiting: VecDeque::new(),
            replays,
            next_tick: Instant::now() + TICK,
            views: Pending::default(),
        };
        let handle = Handle {
            commands: tx,
            wake: wake_tx,
        };
        Ok((shard, handle))
    }

    /// Follows its engines until `shutdown` is cancelled.
    pub(super) fn run(mut self, shutdown: CancellationToken) {
        let mut ready = Vec::new();
        let mut releaser = Releaser::new(Instant::now());
        while !shutdown.is_cancelled() {
            self.start_replays();
            if let Err(e) = self.poll(&mut ready) {
                tracing::warn!("engine shard: {e}");
                std::thread::sleep(RETRY);
                continue;
            }
            let now = Instant::now();
            if ready.iter().any(Source::carries_messages) {
                releaser.read(now);
            }
            // What the messages' bursts left goes back to the system.
            releaser.look(now);
            for source in ready.drain(..) {
                self.handle(source);
            }
            let now = Instant::now();
            self.deadlines(now);
            if now >= self.next_tick {
                self.next_tick = now + TICK;
                self.tick(now);
            }
            self.views.flush(&self.env.index, now);
        }
        for (_, slot) in &self.slots {
            slot.session.stats.set_connected(false);
        }
    }

    /// Waits for a socket or a command; `ready` gets what is readable.
    fn poll(&self, ready: &mut Vec<Source>) -> Result<(), zmq::Error> {
        let mut items = Vec::with_capacity(1 + 2 * self.groups.len() + 2 * self.own.len());
        let mut what = Vec::with_capacity(items.capacity());
        items.push(zmq::PollItem::from_fd(self.wake.as_raw_fd(), zmq::POLLIN));
        what.push(Source::Wake);
        for (&g, group) in &self.groups {
            items.push(group.watched.socket.as_poll_item(zmq::POLLIN));
            what.push(Source::Group(g));
            items.push(group.watched.monitor.as_poll_item(zmq::POLLIN));
            what.push(Source::GroupMonitor(g));
        }
        for &id in &self.own {
            if let Place::Own(w) = &self.slots[id].place {
                items.push(w.socket.as_poll_item(zmq::POLLIN));
                what.push(Source::Own(id));
                items.push(w.monitor.as_poll_item(zmq::POLLIN));
                what.push(Source::OwnMonitor(id));
            }
        }
        for &id in &self.replaying {
            if let Some((d, _)) = &self.slots[id].dealer {
                items.push(d.as_poll_item(zmq::POLLIN));
                what.push(Source::Dealer(id));
            }
        }
        let wait = self.views.wait_ms(Instant::now(), self.env.cfg.poll_ms());
        zmq::poll(&mut items, wait)?;
        ready.extend(
            items
                .iter()
                .zip(&what)
                .filter(|(i, _)| i.is_readable())
                .map(|(_, w)| *w),
        );
        Ok(())
    }

    fn handle(&mut self, source: Source) {
        match source {
            Source::Wake => {
                let mut buf = [0u8; 64];
                while matches!((&self.wake).read(&mut buf), Ok(n) if n > 0) {}
                while let Ok(command) = self.commands.try_recv() {
                    self.command(command);
                }
            }
            Source::Group(g) => self.group_messages(g),
            Source::GroupMonitor(g) => {
                let Some(group) = self.groups.get(&g) else {
                    return;
                };
                let mut events = Vec::new();
                while let Ok(frames) = group.watched.monitor.recv_multipart(zmq::DONTWAIT) {
                    let Some(event) = monitor_event(&frames) else {
                        continue;
                    };
                    let id =
                        endpoint_addr(&event.endpoint).and_then(|a| group.routes.by_addr.get(&a));
                    if let Some(&id) = id {
                        events.push((id, event.up));
                    }
                }
                for (id, up) in events {
                    self.connected(id, up);
                }
            }
            Source::Own(id) => {
                for _ in 0..BURST {
                    let Some(Place::Own(w)) = self.slots.get(id).map(|s| &s.place) else {
                        return;
                    };
                    let Ok(frames) = w.socket.recv_multipart(zmq::DONTWAIT) else {
                        break;
                    };
                    self.slots[id].session.own_message(&self.env, &frames);
                    self.settle(id);
                }
            }
            Source::OwnMonitor(id) => {
                let mut events = Vec::new();
                if let Some(Place::Own(w)) = self.slots.get(id).map(|s| &s.place) {
                    while let Ok(frames) = w.monitor.recv_multipart(zmq::DONTWAIT) {
                        events.extend(monitor_event(&frames).map(|e| e.up));
                    }
                }
                for up in events {
                    self.connected(id, up);
                }
            }
            Source::Dealer(id) => {
                for _ in 0..BURST {
                    let Some(Some((d, _))) = self.slots.get(id).map(|s| &s.dealer) else {
                        return;
                    };
                    let Ok(frames) = d.recv_multipart(zmq::DONTWAIT) else {
                        break;
                    };
                    self.slots[id].session.reply(&self.env, &frames);
                    self.settle(id);
                }
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Add(session, seat) => {
                let pod = session.sub.pod.clone();
                // The subscription this one replaces is gone already (its
                // stop was cancelled and waited for); a leftover is dropped.
                if let Some(old) = self.by_pod.get(&pod).copied() {
                    self.remove(old);
                }
                let id = self.slots.insert(Slot {
                    session: *session,
                    seat,
                    place: Place::Unplaced(Instant::now()),
                    dealer: None,
                    queued: false,
                });
                self.by_pod.insert(pod, id);
                self.place(id);
                self.slots[id].session.publish(&self.env, &mut self.views);
            }
            Command::Remove(pod) => {
                let id = self.by_pod.get(&pod).copied();
                if let Some(id) = id.filter(|&id| self.slots[id].session.stop.is_cancelled()) {
                    self.remove(id);
                }
            }
        }
    }

    /// Opens or joins the sockets that bring `id`'s live messages; on
    /// failure, says why where `list-engines` shows it and tries again
    /// later.
    fn place(&mut self, id: usize) {
        let placed = match self.slots[id].seat {
            Seat::Group { id: g, addr } => self.join_group(id, g, addr),
            Seat::Own => self.open_own(id),
        };
        match placed {
            Ok(place) => {
                if matches!(place, Place::Own(_)) {
                    self.own.insert(id);
                }
                self.slots[id].place = place;
                self.slots[id].session.stats.set_unfollowed(false);
            }
            Err(e) => {
                let session = &self.slots[id].session;
                session.stats.set_unfollowed(true);
                let what =
                    format!("not followed: engine socket error: {e} (tried again every second)");
                if session.stats.problem(Problem::Socket, &what) {
                    tracing::warn!(pod = %session.sub.pod, endpoint = %session.sub.endpoint, "{what}");
                }
                session.stats.set_connected(false);
                self.slots[id].place = Place::Unplaced(Instant::now() + RETRY);
            }
        }
    }

    /// Connects `id` through group `g`'s socket, opened if it is the
    /// group's first engine.
    fn join_group(&mut self, id: usize, g: u64, addr: SocketAddr) -> Result<Place, zmq::Error> {
        let sub = &self.slots[id].session.sub;
        let group = match self.groups.entry(g) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let socket = sockets::bounded(&self.ctx, zmq::SUB, &self.env.cfg)?;
                // Every topic: messages are told apart here, by origin.
                socket.set_subscribe(b"")?;
                e.insert(Group {
                    watched: Watched::new(&self.ctx, socket)?,
                    routes: Routes::default(),
                })
            }
        };
        if let Err(e) = group.watched.socket.connect(&sub.endpoint) {
            if group.routes.is_empty() {
                self.groups.remove(&g);
            }
            return Err(e);
        }
        group.routes.insert(addr, &sub.topic, id);
        Ok(Place::Group { group: g, addr })
    }

    fn open_own(&mut self, id: usize) -> Result<Place, zmq::Error> {
        let sub = &self.slots[id].session.sub;
        let socket = sockets::bounded(&self.ctx, zmq::SUB, &self.env.cfg)?;
        socket.set_subscribe(sub.topic.as_bytes())?;
        let watched = Watched::new(&self.ctx, socket)?;
        watched.socket.connect(&sub.endpoint)?;
        Ok(Place::Own(watched))
    }

    /// Closes `id`'s sockets and drops its session.
    fn remove(&mut self, id: usize) {
        let slot = self.slots.remove(id);
        self.by_pod.remove(&slot.session.sub.pod);
        self.own.remove(&id);
        self.replaying.remove(&id);
        self.waiting.retain(|&w| w != id);
        if let Place::Group { group: g, addr } = slot.place {
            if let Some(group) = self.groups.get_mut(&g) {
                let _ = group.watched.socket.disconnect(&slot.session.sub.endpoint);
                group.routes.remove(addr, &slot.session.sub.topic, id);
                if group.routes.is_empty() {
                    self.groups.remove(&g);
                }
            }
        }
        slot.session.stats.set_connected(false);
    }

    /// Takes a burst of group `g`'s messages, each to the engine of its
    /// address and topic.
    fn group_messages(&mut self, g: u64) {
        for _ in 0..BURST {
            let Some(group) = self.groups.get(&g) else {
                return;
            };
            let Some((frames, from)) = receive(&group.watched.socket) else {
                return;
            };
            let live = match parse_live(&frames) {
                Ok(m) => m,
                Err(e) => {
                    // Some engine at that address sent it; one of them
                    // hears of it.
                    if let Some(Ok(id) | Err(id)) = group.routes.owner(from, b"") {
                        self.slots[id]
                            .session
                            .bad_message(&format!("live message: {e}"));
                    }
                    continue;
                }
            };
            match group.routes.owner(from, live.topic) {
                Some(Ok(id)) => {
                    let payload = live.payload.to_vec();
                    self.slots[id].session.live(&self.env, live.seq, payload);
                    self.settle(id);
                }
                Some(Err(id)) => {
                    let topic = String::from_utf8_lossy(live.topic);
                    self.slots[id]
                        .session
                        .bad_message(&format!("message for another topic ({topic:?})"));
                }
                // From no engine of the group's (one just removed).
                None => {}
            }
        }
    }

    fn connected(&mut self, id: usize, up: bool) {
        if let Some(slot) = self.slots.get_mut(id) {
            slot.session.connected(&self.env, up);
            self.settle(id);
        }
    }

    /// After `id`'s session took something in: its replay socket follows
    /// its replay (closed when none runs), a replay it wants is sent or
    /// waits for a permit, and its view is handed on.
    fn settle(&mut self, id: usize) {
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        if !slot.session.replaying() {
            slot.dealer = None;
        }
        if slot.session.asks() {
            if slot.dealer.is_some() {
                send_replay(&self.env, slot);
            } else if !slot.queued {
                slot.queued = true;
                self.waiting.push_back(id);
            }
        }
        slot.session.publish(&self.env, &mut self.views);
        self.track(id);
        if !self.waiting.is_empty() {
            self.start_replays();
        }
    }

    /// Keeps `replaying` to the slots with a replay socket or deadline.
    fn track(&mut self, id: usize) {
        match self.slots.get(id) {
            Some(s) if s.dealer.is_some() || s.session.awaiting() => {
                self.replaying.insert(id);
            }
            _ => {
                self.replaying.remove(&id);
            }
        }
    }

    /// Opens replay sockets for the replays waiting, while permits last.
    fn start_replays(&mut self) {
        while let Some(&id) = self.waiting.front() {
            let Some(slot) = self.slots.get_mut(id) else {
                self.waiting.pop_front();
                continue;
            };
            if !slot.session.asks() || !slot.session.replaying() {
                slot.queued = false;
                self.waiting.pop_front();
                continue;
            }
            let Some(permit) = self.replays.take(self.env.cfg.max_replays) else {
                return;
            };
            self.waiting.pop_front();
            slot.queued = false;
            match open_dealer(&self.ctx, &self.env, &slot.session) {
                Ok(socket) => {
                    slot.dealer = Some((socket, permit));
                    send_replay(&self.env, slot);
                }
                Err(e) => {
                    let what = format!("replay socket error: {e}");
                    if slot.session.stats.problem(Problem::Socket, &what) {
                        tracing::warn!(pod = %slot.session.sub.pod, "{what}");
                    }
                    // Not sent: its deadline ends it as an unanswered
                    // replay would.
                    slot.session.take_ask();
                    slot.session.sent(&self.env);
                }
            }
            self.track(id);
        }
    }

    /// Ends the replays past their deadline (their late answers must not
    /// pass for the next request's: their socket goes first).
    fn deadlines(&mut self, now: Instant) {
        let overdue: Vec<usize> = self
            .replaying
            .iter()
            .copied()
            .filter(|&id| self.slots[id].session.overdue(now))
            .collect();
        for id in overdue {
            self.slots[id].dealer = None;
            self.slots[id].session.timed_out(&self.env);
            self.settle(id);
        }
    }

    /// Once a second: drops cancelled subscriptions, places again the
    /// engines whose sockets failed, and hands on views that changed with
    /// time (a learning period ending).
    fn tick(&mut self, now: Instant) {
        let cancelled: Vec<usize> = self
            .slots
            .iter()
            .filter(|(_, s)| s.session.stop.is_cancelled())
            .map(|(id, _)| id)
            .collect();
        for id in cancelled {
            self.remove(id);
        }
        let due: Vec<usize> = self
            .slots
            .iter()
            .filter(|(_, s)| matches!(s.place, Place::Unplaced(at) if at <= now))
            .map(|(id, _)| id)
            .collect();
        for id in due {
            self.place(id);
        }
        let ids: Vec<usize> = self.slots.iter().map(|(id, _)| id).collect();
        for id in ids {
            if self.slots[id].session.heed(&self.env) {
                // A replay it now wants is sent, and its view handed on.
                self.settle(id);
            } else {
                self.slots[id].session.publish(&self.env, &mut self.views);
            }
        }
    }
}

/// A replay socket for `session`'s engine.
fn open_dealer(ctx: &Context, env: &Env, session: &Session) -> Result<Socket, zmq::Error> {
    let endpoint = session.sub.replay.as_deref().ok_or(zmq::Error::EINVAL)?;
    let socket = sockets::bounded(ctx, zmq::DEALER, &env.cfg)?;
    socket.connect(endpoint)?;
    Ok(socket)
}

/// Sends the replay `slot` wants on its replay socket.
fn send_replay(env: &Env, slot: &mut Slot) {
    let (Some((socket, _)), Some(from)) = (&slot.dealer, slot.session.take_ask()) else {
        return;
    };
    if let Err(e) = socket.send_multipart(replay_request(from), zmq::DONTWAIT) {
        slot.session.bad_message(&format!("replay request: {e}"));
    }
    // Unsent or not, a replay that does not end by then is given up.
    slot.session.sent(env);
}

/// The next message waiting on `socket`, whole, with the address of the
/// peer that sent it.
fn receive(socket: &zmq::Socket) -> Option<(Vec<Vec<u8>>, Option<IpAddr>)> {
    let mut first = socket.recv_msg(zmq::DONTWAIT).ok()?;
    let from = first.gets("Peer-Address").and_then(|a| a.parse().ok());
    let mut frames = vec![first.to_vec()];
    while first.get_more() {
        first = socket.recv_msg(0).ok()?;
        frames.push(first.to_vec());
    }
    Some((frames, from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_permits_are_bounded_and_given_back() {
        let replays = Arc::new(Replays::default());
        let a = replays.take(2).unwrap();
        let _b = replays.take(2).unwrap();
        assert!(replays.take(2).is_none());
        drop(a);
        assert_eq!(replays.running(), 1);
        assert!(replays.take(2).is_some());
    }
}
