//! Engines found through DNS (`--engine-dns`): the engines of a headless
//! Service, followed as its records come and go.
//!
//! A source names a DNS SRV record set, such as the one Kubernetes
//! publishes for a named port of a headless Service
//! (`_kv-events._tcp.vllm.<namespace>.svc.cluster.local`): one record per
//! engine, whose target is the engine's own name (`vllm-0.vllm.<namespace>
//! .svc.cluster.local` for a StatefulSet's pod) and whose port is its PUB
//! socket's. Each engine becomes the subscription of the source's template
//! (model, block size, topic, media) with the pod named by the target's
//! first label, the endpoint at the target's address and that port, and the
//! replay endpoint, if the source has a replay port, at the same address.
//!
//! Every `interval` the task resolves each source again and compares what
//! it found with what it follows: an engine that appears (or moves to
//! another address) is subscribed, one that is gone is unsubscribed, in one
//! batch each, with the limits and metrics of any subscription. A source
//! that fails to resolve (a timeout, a refusal, a server failure) keeps
//! what it follows until it answers again; one that answers with no
//! records (NXDOMAIN, or none of that type) follows no engine.
//!
//! The subscriptions made here are not kept across restarts (the records
//! say again what to follow), and never touch a pod followed otherwise (a
//! configured subscription, a run-time one, the central collector's): the
//! record is skipped, and counted, while that lasts.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;
use tokio_util::sync::CancellationToken;

use super::{Engines, SubscribeError, Subscription, SubscriptionError};

/// One `--engine-dns` source: an SRV name and the subscription its engines
/// share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSource {
    /// The SRV record set listing the engines, e.g.
    /// `_kv-events._tcp.vllm.default.svc.cluster.local`.
    pub srv: String,
    /// The engines' replay (ROUTER) port, if they have one.
    pub replay_port: Option<u16>,
    /// What every engine's subscription shares: model, block size, topic
    /// and media (its pod and endpoints are the records').
    pub template: Subscription,
}

/// The keys of a source's text form besides the subscription's own.
const OWN_KEYS: [&str; 2] = ["srv", "replay-port"];
/// The subscription's keys a source may set: the rest come from records.
const SHARED_KEYS: [&str; 4] = ["model", "block-size", "topic", "media"];

impl FromStr for DnsSource {
    type Err = SubscriptionError;

    /// `srv=<name>,model=<model>` with optional `replay-port=<port>`,
    /// `block-size=<tokens>`, `topic=<topic>` and `media=GPU+CPU`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |why: String| SubscriptionError {
            text: text.into(),
            why,
        };
        let mut srv = None;
        let mut replay_port = None;
        let mut shared = Vec::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err(format!("{part:?} is not key=value")))?;
            let (k, v) = (k.trim(), v.trim());
            match k {
                "srv" if srv.is_none() => srv = Some(v.to_string()),
                "replay-port" if replay_port.is_none() => {
                    replay_port = Some(
                        v.parse::<u16>()
                            .ok()
                            .filter(|&p| p > 0)
                            .ok_or_else(|| err(format!("replay-port={v} is not a port number")))?,
                    )
                }
                k if OWN_KEYS.contains(&k) => return Err(err(format!("{k} given twice"))),
                k if SHARED_KEYS.contains(&k) => shared.push(format!("{k}={v}")),
                k => {
                    return Err(err(format!(
                        "unknown key {k} (srv, model, replay-port, block-size, topic, media)"
                    )))
                }
            }
        }
        let srv = srv
            .filter(|s| !s.is_empty())
            .ok_or_else(|| err("srv= is missing".into()))?;
        // The subscription's own parser checks the shared fields, with a
        // stand-in pod and endpoint that every record replaces.
        let template: Subscription = format!("pod=-,endpoint=tcp://-:0,{}", shared.join(","))
            .parse()
            .map_err(|e: SubscriptionError| err(e.why))?;
        Ok(DnsSource {
            srv,
            replay_port,
            template,
        })
    }
}

impl fmt::Display for DnsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.template;
        write!(f, "srv={},model={}", self.srv, t.model)?;
        if let Some(p) = self.replay_port {
            write!(f, ",replay-port={p}")?;
        }
        write!(f, ",block-size={}", t.block_size)?;
        if !t.topic.is_empty() {
            write!(f, ",topic={}", t.topic)?;
        }
        write!(f, ",media={}", t.media.join("+"))
    }
}

impl DnsSource {
    /// The subscription of the engine a record names: `target` (a domain
    /// name) reached at `addr`. None for a target with no name to give the
    /// pod (the root, ".", which says the service is not offered).
    pub fn subscription(&self, target: &str, addr: SocketAddr) -> Option<Subscription> {
        let pod = target.split('.').next().filter(|l| !l.is_empty())?;
        let at = |port: u16| format!("tcp://{}", SocketAddr::new(addr.ip(), port));
        Some(Subscription {
            pod: pod.to_ascii_lowercase(),
            endpoint: at(addr.port()),
            replay: self.replay_port.map(at),
            ..self.template.clone()
        })
    }
}

/// Engines found through DNS: the sources, how often they are resolved
/// again, and by which server.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsConfig {
    /// The sources, in order: a pod two of them name is followed by the
    /// first.
    pub sources: Vec<DnsSource>,
    /// How often every source is resolved again.
    pub interval: Duration,
    /// The DNS server asked (`ip:port`); none: the system's
    /// (`/etc/resolv.conf`, which Kubernetes writes for each pod).
    pub server: Option<SocketAddr>,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            sources: Vec::new(),
            // Kubernetes' DNS caches a Service's records for 5 to 30 s: a
            // new engine is followed within about that long again.
            interval: Duration::from_secs(10),
            server: None,
        }
    }
}

/// A source's counters, read by the metrics at scrape time.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Rounds whose lookup answered (records or none).
    pub resolved: AtomicU64,
    /// Rounds whose lookup failed: what the source follows was kept.
    pub failed: AtomicU64,
    /// Engines its records named that could not be followed: refused
    /// (max-engines, the index's bounds), or their pod followed otherwise.
    pub refused: AtomicU64,
    /// Engines it follows now.
    pub followed: AtomicI64,
}

/// What one round changes: the subscriptions to make (new engines and
/// engines at a new address) and those to drop.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Subscriptions to make, each with the index of its source.
    pub follow: Vec<(usize, Subscription)>,
    /// Subscriptions made before whose engines are gone.
    pub drop: Vec<Subscription>,
}

/// The changes that take `made` (by pod, with each source's index) to
/// `found`.
pub fn plan(
    made: &BTreeMap<String, (usize, Subscription)>,
    found: &BTreeMap<String, (usize, Subscription)>,
) -> Changes {
    let follow = found
        .iter()
        .filter(|(pod, now)| made.get(*pod).map(|(_, s)| s) != Some(&now.1))
        .map(|(_, now)| now.clone())
        .collect();
    let drop = made
        .iter()
        .filter(|(pod, _)| !found.contains_key(*pod))
        .map(|(_, (_, sub))| sub.clone())
        .collect();
    Changes { follow, drop }
}

/// A resolver asking `cfg.server`, or the system's servers.
fn resolver(cfg: &DnsConfig) -> Result<TokioResolver, NetError> {
    let mut builder = match cfg.server {
        Some(addr) => {
            let mut server = NameServerConfig::udp_and_tcp(addr.ip());
            for c in &mut server.connections {
                c.port = addr.port();
            }
            let config = ResolverConfig::from_parts(None, Vec::new(), vec![server]);
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        }
        None => TokioResolver::builder_tokio()?,
    };
    let opts = builder.options_mut();
    // A round never outlasts the period: a server that does not answer
    // is a failed round, retried at the next.
    opts.timeout = opts.timeout.min(cfg.interval / 2);
    opts.attempts = 1;
    builder.build()
}

/// The engines `source`'s records name, by pod; none when it has no
/// records.
async fn resolve(
    resolver: &TokioResolver,
    source: &DnsSource,
) -> Result<Vec<Subscription>, NetError> {
    let lookup = match resolver.srv_lookup(source.srv.as_str()).await {
        Ok(lookup) => lookup,
        Err(e) if e.is_no_records_found() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut subs = Vec::new();
    for record in lookup.answers() {
        let RData::SRV(srv) = &record.data else {
            continue;
        };
        // The target's address, from the answer's additional records
        // (Kubernetes' DNS sends them) or a lookup of its own.
        let given = lookup.additionals().iter().find_map(|a| match &a.data {
            RData::A(ip) if a.name == srv.target => Some(IpAddr::V4(ip.0)),
            RData::AAAA(ip) if a.name == srv.target => Some(IpAddr::V6(ip.0)),
            _ => None,
        });
        let ip = match given {
            Some(ip) => ip,
            None => match resolver.lookup_ip(srv.target.clone()).await {
                Ok(ips) => match ips.iter().next() {
                    Some(ip) => ip,
                    None => continue,
                },
                // An engine whose name is gone since the SRV answer left.
                Err(e) if e.is_no_records_found() => continue,
                Err(e) => return Err(e),
            },
        };
        let target = srv.target.to_utf8();
        if let Some(sub) = source.subscription(&target, SocketAddr::new(ip, srv.port)) {
            subs.push(sub);
        }
    }
    Ok(subs)
}

/// Follows the engines of `engines`' DNS sources until `stop`, starting
/// once the engines have started (after a cold replica's fill).
pub(crate) async fn run(engines: Arc<Engines>, stop: CancellationToken) {
    let cfg = engines.config().dns.clone();
    if cfg.sources.is_empty() {
        return;
    }
    let resolver = match resolver(&cfg) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "engines found through DNS: no resolver; none is followed");
            return;
        }
    };
    tokio::select! {
        () = engines.until_started() => {}
        () = stop.cancelled() => return,
    }
    let mut round = Round {
        engines,
        made: BTreeMap::new(),
        refused: BTreeMap::new(),
        settled: false,
    };
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        // Each round asks the server again, not the resolver's cache.
        resolver.clear_cache();
        let mut answers = Vec::with_capacity(cfg.sources.len());
        for source in &cfg.sources {
            let answer = tokio::time::timeout(cfg.interval, resolve(&resolver, source)).await;
            answers.push(match answer {
                Ok(Ok(subs)) => Ok(subs),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {:?}", cfg.interval)),
            });
        }
        round.apply(&cfg.sources, answers).await;
    }
}

/// What the task follows between rounds.
struct Round {
    engines: Arc<Engines>,
    /// The subscriptions made, by pod, with their source's index.
    made: BTreeMap<String, (usize, Subscription)>,
    /// Why each pod a record names is not followed, as last logged.
    refused: BTreeMap<String, String>,
    /// Whether a round has answered for every source (the engine-fed pods
    /// of a snapshot that none follows are dropped then).
    settled: bool,
}

impl Round {
    /// Follows what `answers` (one per source: its engines, or why it
    /// failed) say.
    async fn apply(
        &mut self,
        sources: &[DnsSource],
        answers: Vec<Result<Vec<Subscription>, String>>,
    ) {
        let engines = self.engines.clone();
        let stats = engines.dns_stats();
        let mut found: BTreeMap<String, (usize, Subscription)> = BTreeMap::new();
        let mut all_answered = true;
        for (i, answer) in answers.into_iter().enumerate() {
            let subs = match answer {
                Ok(subs) => {
                    // Relaxed: statistics.
                    stats[i].resolved.fetch_add(1, Ordering::Relaxed);
                    if subs.is_empty() {
                        tracing::debug!(source = %sources[i].srv, "engines found through DNS: no records");
                    }
                    subs
                }
                Err(why) => {
                    all_answered = false;
                    stats[i].failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(source = %sources[i].srv, "engines found through DNS: lookup failed, keeping the engines it follows: {why}");
                    let kept = self.made.values().filter(|(s, _)| *s == i);
                    kept.map(|(_, sub)| sub.clone()).collect()
                }
            };
            for sub in subs {
                if let Some((first, _)) = found.get(&sub.pod) {
                    if *first != i {
                        self.note_refused(&sub.pod, || {
                            format!("also named by {}, which follows it", sources[*first].srv)
                        });
                    }
                    continue;
                }
                found.insert(sub.pod.clone(), (i, sub));
            }
        }
        let changes = plan(&self.made, &found);
        if !changes.follow.is_empty() || !changes.drop.is_empty() || !self.settled {
            self.change(changes, all_answered).await;
        }
        let mut followed = vec![0i64; sources.len()];
        for (i, _) in self.made.values() {
            followed[*i] += 1;
        }
        for (s, n) in stats.iter().zip(followed) {
            // Relaxed: a statistic.
            s.followed.store(n, Ordering::Relaxed);
        }
    }

    /// Makes and drops the subscriptions of `changes` (on the blocking
    /// pool: a subscription waits for the engine state it replaces).
    async fn change(&mut self, changes: Changes, all_answered: bool) {
        let engines = self.engines.clone();
        let settle = all_answered && !self.settled;
        let made = self.made.clone();
        let task = tokio::task::spawn_blocking(move || {
            let dropped = engines.unfollow_found(&changes.drop);
            let subs: Vec<Subscription> = changes.follow.iter().map(|(_, s)| s.clone()).collect();
            let followed = engines.follow_found(subs, &made);
            if settle {
                engines.drop_unfollowed_found();
            }
            (changes, dropped, followed)
        });
        let Ok((changes, dropped, followed)) = task.await else {
            return;
        };
        for (sub, gone) in changes.drop.iter().zip(dropped) {
            self.made.remove(&sub.pod);
            if gone {
                tracing::info!(pod = %sub.pod, "engines found through DNS: gone from the records, unsubscribed");
            }
        }
        let engines = self.engines.clone();
        let stats = engines.dns_stats();
        for ((i, sub), result) in changes.follow.into_iter().zip(followed) {
            match result {
                Ok(()) => {
                    tracing::info!(pod = %sub.pod, endpoint = %sub.endpoint, "engines found through DNS: following");
                    self.refused.remove(&sub.pod);
                    self.made.insert(sub.pod.clone(), (i, sub));
                }
                Err(e) => {
                    // Relaxed: a statistic.
                    stats[i].refused.fetch_add(1, Ordering::Relaxed);
                    // A subscription of ours that another replaced is not
                    // ours to drop; one refused a new address stays ours
                    // (it still runs), tried again at the next round.
                    if matches!(e, FoundError::FollowedOtherwise) {
                        self.made.remove(&sub.pod);
                    }
                    self.note_refused(&sub.pod, || e.to_string());
                }
            }
        }
        self.settled |= settle;
    }

    /// Logs why `pod` is not followed, once for each new reason.
    fn note_refused(&mut self, pod: &str, why: impl FnOnce() -> String) {
        let why = why();
        if self.refused.get(pod) != Some(&why) {
            tracing::warn!(%pod, "engines found through DNS: not followed: {why}");
            self.refused.insert(pod.to_string(), why);
        }
    }
}

impl Engines {
    /// Resolves once [`Engines::start`] has run.
    async fn until_started(&self) {
        let mut started = self.started.subscribe();
        // The sender lives as long as `self`: this ends only when started.
        let _ = started.wait_for(|s| *s).await;
    }

    /// The counters of each `--engine-dns` source, in order.
    pub fn dns_stats(&self) -> &[SourceStats] {
        &self.dns
    }

    /// Follows each of `subs`, found through DNS, unless its pod is
    /// followed by a subscription other than the one `made` says the DNS
    /// task made for it; one result each. Not kept across restarts.
    fn follow_found(
        self: &Arc<Self>,
        subs: Vec<Subscription>,
        made: &BTreeMap<String, (usize, Subscription)>,
    ) -> Vec<Result<(), FoundError>> {
        // Run-time ops and these are applied one at a time.
        let _keeper = self.keeper.lock();
        let ours: Vec<bool> = {
            let running = self.running.lock();
            let ours = |s: &Subscription| match running.get(&s.pod) {
                None => true,
                Some(r) => made.get(&s.pod).is_some_and(|(_, m)| *m == r.sub),
            };
            subs.iter().map(ours).collect()
        };
        let free: Vec<Subscription> = subs
            .into_iter()
            .zip(&ours)
            .filter_map(|(s, &o)| o.then_some(s))
            .collect();
        let mut results = self.subscribe_batch(&free).into_iter();
        ours.into_iter()
            .map(|o| match o {
                true => results.next().unwrap_or(Ok(())).map_err(FoundError::from),
                false => Err(FoundError::FollowedOtherwise),
            })
            .collect()
    }

    /// Stops following each of `subs` whose pod is still followed by that
    /// very subscription (one made through DNS that nothing replaced);
    /// whether each was.
    fn unfollow_found(&self, subs: &[Subscription]) -> Vec<bool> {
        let _keeper = self.keeper.lock();
        let ours: Vec<bool> = {
            let running = self.running.lock();
            let ours = |s: &Subscription| running.get(&s.pod).is_some_and(|r| r.sub == *s);
            subs.iter().map(ours).collect()
        };
        let pods: Vec<&str> = subs
            .iter()
            .zip(&ours)
            .filter_map(|(s, &o)| o.then_some(&*s.pod))
            .collect();
        drop(self.take_out_all(&pods));
        ours
    }

    /// Drops the engine-fed pods of a snapshot that no subscription
    /// follows, as [`Engines::start`] does when no DNS source may follow
    /// them again (and no central collector may meet them).
    fn drop_unfollowed_found(&self) {
        if self.cfg.listen.is_none() {
            self.drop_unfollowed();
        }
    }
}

/// Why an engine found through DNS is not followed.
#[derive(Debug, thiserror::Error)]
pub enum FoundError {
    /// Its pod is followed by another subscription.
    #[error("the pod is followed by another subscription (configured, made at run time, or met by --engine-listen)")]
    FollowedOtherwise,
    /// The subscription was refused.
    #[error(transparent)]
    Refused(#[from] SubscribeError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(text: &str) -> DnsSource {
        text.parse().unwrap()
    }

    #[test]
    fn a_source_reads_and_writes_its_text() {
        let s =
            source("srv=_kv._tcp.vllm.ns.svc,model=m,replay-port=5558,block-size=32,media=GPU+cpu");
        assert_eq!(s.srv, "_kv._tcp.vllm.ns.svc");
        assert_eq!(s.replay_port, Some(5558));
        assert_eq!(s.template.model, "m");
        assert_eq!(s.template.block_size, 32);
        assert_eq!(s.template.media, ["GPU", "CPU"]);
        assert_eq!(source(&s.to_string()), s);
    }

    #[test]
    fn a_source_without_its_name_or_model_or_with_a_record_field_is_refused() {
        for (text, why) in [
            ("model=m", "srv= is missing"),
            ("srv=x", "model= is missing"),
            ("srv=x,model=m,pod=p", "unknown key pod"),
            ("srv=x,model=m,endpoint=tcp://a:1", "unknown key endpoint"),
            ("srv=x,model=m,replay-port=0", "not a port number"),
            ("srv=x,model=m,replay-port=70000", "not a port number"),
            ("srv=x,srv=y,model=m", "srv given twice"),
            ("srv=x,model=m,block-size=x", "block-size=x is not a number"),
            ("srv=x,model", "is not key=value"),
        ] {
            let e = text.parse::<DnsSource>().unwrap_err();
            assert!(e.why.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_record_names_the_pod_by_its_targets_first_label_at_its_address() {
        let s = source("srv=_kv._tcp.vllm.ns.svc,model=m,replay-port=5558");
        let sub = s
            .subscription(
                "vLLM-0.vllm.ns.svc.cluster.local.",
                "10.1.2.3:5557".parse().unwrap(),
            )
            .unwrap();
        assert_eq!(sub.pod, "vllm-0");
        assert_eq!(sub.endpoint, "tcp://10.1.2.3:5557");
        assert_eq!(sub.replay.as_deref(), Some("tcp://10.1.2.3:5558"));
        assert_eq!(sub.model, "m");
        let v6 = s
            .subscription("e.x.", "[fd00::1]:5557".parse().unwrap())
            .unwrap();
        assert_eq!(v6.endpoint, "tcp://[fd00::1]:5557");
        assert_eq!(s.subscription(".", "10.0.0.1:1".parse().unwrap()), None);
        let no_replay = source("srv=x,model=m").subscription("a.b.", "10.0.0.1:1".parse().unwrap());
        assert_eq!(no_replay.unwrap().replay, None);
    }

    #[test]
    fn a_plan_follows_new_and_moved_engines_and_drops_gone_ones() {
        let s = source("srv=x,model=m");
        let at = |pod: &str, ip: &str| {
            let sub = s.subscription(&format!("{pod}.x."), format!("{ip}:5557").parse().unwrap());
            (pod.to_string(), (0, sub.unwrap()))
        };
        let made: BTreeMap<_, _> = [
            at("a", "10.0.0.1"),
            at("b", "10.0.0.2"),
            at("c", "10.0.0.3"),
        ]
        .into();
        let found: BTreeMap<_, _> = [
            at("a", "10.0.0.1"),
            at("b", "10.0.0.9"),
            at("d", "10.0.0.4"),
        ]
        .into();
        let changes = plan(&made, &found);
        let follow: Vec<_> = changes
            .follow
            .iter()
            .map(|(_, s)| s.endpoint.as_str())
            .collect();
        assert_eq!(follow, ["tcp://10.0.0.9:5557", "tcp://10.0.0.4:5557"]);
        let drop: Vec<_> = changes.drop.iter().map(|s| s.pod.as_str()).collect();
        assert_eq!(drop, ["c"]);
        assert_eq!(plan(&found, &found), Changes::default());
    }
}
