//! The central collector: one bound SUB socket that engines connect their
//! PUB sockets to (vLLM's publisher connects when its endpoint names a
//! host rather than `*`), each publishing under the topic
//! `kv@<pod>@<model>` (llm-d's convention). Pods are registered on their
//! first message, up to `max-engines`; there is no replay endpoint, so
//! gaps and restarts resync the pod.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use prefix_events::{parse_live, parse_topic};

use super::admission::{self, Binding, Check, EngineRefusal, Verdict};
use super::session::{Env, Session};
use super::stats::Problem;
use super::{Engines, StartError};

/// One pod met by the collector.
struct Pod {
    /// Its session, whose `stop` is cancelled when the pod is unsubscribed:
    /// its engine state is gone, and its next message meets it again, as
    /// new.
    session: Session,
    /// Where its messages may come from.
    origin: Binding,
}

/// The bound socket and what it has met.
pub(super) struct Collector {
    engines: Arc<Engines>,
    socket: super::sockets::Socket,
    /// Answers libzmq's questions about each connection to `socket`
    /// (`admission`): served by the collector's own thread, between bursts.
    zap: super::sockets::Socket,
    pods: HashMap<String, Pod>,
    /// What the sessions read: the index and the settings.
    env: Env,
    /// Views changed since the index was last given them.
    views: super::view::Pending,
    /// When every pod is looked at next ([`Collector::look`]).
    next_look: Instant,
}

/// How often every pod met is looked at while messages keep coming (an
/// idle collector looks at each pause).
const LOOK: std::time::Duration = std::time::Duration::from_secs(1);

impl Collector {
    /// Binds the SUB socket to `endpoint` and subscribes to every topic:
    /// a message under another topic than `kv@<pod>@<model>` (vLLM's
    /// default empty topic, say) reaches the collector, which counts and
    /// logs it, instead of being dropped unseen by libzmq. Its connections
    /// are admitted by the ZAP handler, bound first so that none comes
    /// before it.
    pub(super) fn bind(engines: Arc<Engines>, endpoint: &str) -> Result<Collector, StartError> {
        let bind = || -> Result<(super::sockets::Socket, super::sockets::Socket), zmq::Error> {
            let zap = engines.ctx.socket(zmq::REP)?;
            zap.set_linger(0)?;
            zap.bind(admission::ENDPOINT)?;
            let socket = super::sockets::bounded(&engines.ctx, zmq::SUB, &engines.cfg)?;
            socket.set_zap_domain(admission::DOMAIN)?;
            socket.set_subscribe(b"")?;
            socket.bind(endpoint)?;
            Ok((socket, zap))
        };
        let (socket, zap) = bind().map_err(|e| StartError::Bind {
            endpoint: endpoint.into(),
            why: e.to_string(),
        })?;
        if engines.cfg.allow.is_open() && !is_loopback(endpoint) {
            tracing::warn!(%endpoint, "--engine-listen takes events from any host that reaches it: set --engine-allow to the engines' networks (docs/operations.md, \"Security model\")");
        }
        let env = Env {
            index: engines.index.clone(),
            cfg: engines.cfg.clone(),
        };
        Ok(Collector {
            engines,
            socket,
            zap,
            pods: HashMap::new(),
            env,
            views: Default::default(),
            next_look: Instant::now() + LOOK,
        })
    }

    /// The port the socket is bound to (tests bind port 0).
    pub(super) fn last_endpoint(&self) -> Option<String> {
        self.socket.get_last_endpoint().ok()?.ok()
    }

    /// Receives until `stop` is cancelled.
    pub(super) fn run(mut self, stop: tokio_util::sync::CancellationToken) {
        let mut releaser = crate::memory::Releaser::new(Instant::now());
        while !stop.is_cancelled() {
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                self.zap.as_poll_item(zmq::POLLIN),
            ];
            let wait = self
                .views
                .wait_ms(Instant::now(), self.engines.cfg.poll_ms());
            let polled = zmq::poll(&mut items, wait);
            let (messages, asked) = (items[0].is_readable(), items[1].is_readable());
            if asked {
                self.admit();
            }
            match polled {
                // Only a ZAP request, answered above (views due are
                // given still: requests may come without a pause).
                Ok(_) if !messages && asked => {
                    self.views.flush(&self.engines.index, Instant::now());
                    continue;
                }
                Ok(_) if !messages => {
                    // What the messages' bursts left goes back to the
                    // system.
                    releaser.look(Instant::now());
                    self.look(Instant::now());
                    self.views.flush(&self.engines.index, Instant::now());
                    continue;
                }
                Ok(_) => {
                    let now = Instant::now();
                    releaser.read(now);
                    releaser.look(now);
                }
                Err(e) => {
                    tracing::warn!("engine collector: {e}");
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    continue;
                }
            }
            // A burst at a time: the stop signal and the ZAP handler are
            // looked at between bursts.
            for _ in 0..super::shard::BURST {
                let Some((frames, origin)) = self.receive() else {
                    break;
                };
                self.message(&frames, origin.as_deref());
            }
            // Under steady traffic too, a second apart.
            let now = Instant::now();
            if now >= self.next_look {
                self.look(now);
            }
            self.views.flush(&self.engines.index, now);
        }
        for pod in self.pods.values() {
            pod.session.stats.set_connected(false);
        }
    }

    /// Looks at every pod met: a doubt from gateways' receipts is acted on,
    /// and views that change with time (a learning period ends) are handed
    /// on.
    fn look(&mut self, now: Instant) {
        for p in self.pods.values_mut() {
            p.session.heed(&self.env);
            p.session.publish(&self.env, &mut self.views);
        }
        self.next_look = now + LOOK;
    }

    /// Answers the ZAP requests waiting.
    fn admit(&self) {
        while let Ok(request) = self.zap.recv_multipart(zmq::DONTWAIT) {
            let (reply, verdict) = admission::answer(&request, &self.engines.cfg.allow);
            match verdict {
                Verdict::Admitted(_) => {}
                Verdict::Refused(address) => {
                    self.engines.refusals.refuse(EngineRefusal::Address, || {
                        format!("a connection from {address}, outside --engine-allow")
                    })
                }
                Verdict::Malformed => {
                    tracing::warn!("engine collector: a ZAP request it does not understand")
                }
            }
            if let Err(e) = self.zap.send_multipart(reply, 0) {
                tracing::warn!("engine collector: cannot answer a ZAP request: {e}");
            }
        }
    }

    /// The next message waiting, whole, with the origin its connection was
    /// admitted as (its `User-Id`).
    fn receive(&self) -> Option<(Vec<Vec<u8>>, Option<String>)> {
        let mut first = self.socket.recv_msg(zmq::DONTWAIT).ok()?;
        let mut frames = vec![first.to_vec()];
        let origin = first.gets("User-Id").map(str::to_owned);
        while first.get_more() {
            first = self.socket.recv_msg(0).ok()?;
            frames.push(first.to_vec());
        }
        Some((frames, origin))
    }

    fn message(&mut self, frames: &[Vec<u8>], origin: Option<&str>) {
        // Every connection the ZAP handler admitted is named; one it did
        // not is none of the operator's engines.
        let Some(origin) = origin else {
            self.engines.refusals.refuse(EngineRefusal::Address, || {
                "a message from a connection the ZAP handler did not admit".into()
            });
            return;
        };
        let live = match parse_live(frames) {
            Ok(live) => live,
            Err(e) => {
                self.engines
                    .stray(|| format!("not a live event message: {e}"));
                return;
            }
        };
        let Some((pod, model)) = parse_topic(live.topic) else {
            self.engines.stray(|| {
                let topic = String::from_utf8_lossy(live.topic);
                let topic: String = topic.chars().take(128).collect();
                format!("topic {topic:?} is not kv@<pod>@<model>")
            });
            return;
        };
        if self
            .pods
            .get(pod)
            .is_none_or(|p| p.session.stop.is_cancelled())
        {
            // Pods unsubscribed since go first (this one, met again as new,
            // among them): they hold no slot of `max-engines` any more,
            // nor should they here.
            self.pods.retain(|_, p| !p.session.stop.is_cancelled());
            let Some(found) = self.meet(pod, model) else {
                self.engines.stray(|| {
                    format!("pod {pod:?} is followed otherwise, refused, or past max-engines")
                });
                return;
            };
            self.pods.insert(pod.to_string(), found);
        }
        let Some(p) = self.pods.get_mut(pod) else {
            return;
        };
        match p.origin.check(origin, self.engines.cfg.allow_moves) {
            Check::Same => {}
            Check::Moved { from } => {
                tracing::info!(%pod, %from, to = origin, "an engine-fed pod moved to another address");
            }
            Check::Foreign { bound } => {
                self.engines.refusals.count_one(EngineRefusal::Moved);
                let what = format!(
                    "refused a message from {origin}: the pod is bound to {bound} (unsubscribe the pod if its engine moved, or --engine-allow-moves)"
                );
                if p.session.stats.problem(Problem::Refused, &what) {
                    tracing::warn!(%pod, "{what}");
                }
                // It may be the pod's own engine, restarted elsewhere: its
                // answers cannot be vouched for until its address speaks.
                p.session.stats.set_connected(false);
                p.session.publish(&self.env, &mut self.views);
                return;
            }
        }
        p.session.stats.set_connected(true);
        p.session.live(&self.env, live.seq, live.payload.to_vec());
        p.session.publish(&self.env, &mut self.views);
    }

    fn meet(&self, pod: &str, model: &str) -> Option<Pod> {
        let (stats, sub, engine, gone) = self.engines.central_pod(pod, model)?;
        Some(Pod {
            session: Session::met(sub, engine, stats, gone),
            origin: Binding::new(),
        })
    }
}

/// Whether a `tcp://host:port` endpoint binds loopback only.
fn is_loopback(endpoint: &str) -> bool {
    let host = endpoint
        .trim_start_matches("tcp://")
        .rsplit_once(':')
        .map_or("", |(host, _)| host)
        .trim_matches(|c| c == '[' || c == ']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
