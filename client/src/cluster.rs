//! [`Cluster`]: several servers, each model placed on one of them by
//! rendezvous (highest-random-weight) hashing of the model name.
//!
//! Every gateway computes the same placement from the same server list, with
//! no coordination: a model goes to the server whose `xxh3(name ‖ 0 ‖ model)`
//! is highest. Adding or removing one server moves only the models it wins or
//! held (about 1/n of them). The index is soft state, so a moved model simply
//! starts cold on its new server. Pods are global: `remove_pod` and
//! `set_pod_capacity` go to every server.

use std::net::SocketAddr;

use xxhash_rust::xxh3::xxh3_64;

use crate::client::{Client, ClientConfig, LookupResult};
use crate::error::{ClientError, ConnectError};
use crate::wire::{Op, Reply, WireStats};

/// A set of servers sharing the models between them.
#[derive(Debug, Clone)]
pub struct Cluster {
    servers: Vec<(String, Client)>,
}

/// The index of the server `model` belongs to among `names` (rendezvous
/// hashing). `None` if there are no servers.
pub fn place(model: &str, names: &[impl AsRef<str>]) -> Option<usize> {
    let mut buf = Vec::with_capacity(300);
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            buf.clear();
            buf.extend_from_slice(name.as_ref().as_bytes());
            buf.push(0);
            buf.extend_from_slice(model.as_bytes());
            (xxh3_64(&buf), i)
        })
        .max()
        .map(|(_, i)| i)
}

impl Cluster {
    /// Starts a client per server. `servers` pairs a stable name (the
    /// placement key, e.g. a StatefulSet pod's DNS name) with its address.
    /// Connections are made in the background, so a server that is down at
    /// start only fails the calls for its models.
    pub fn start(
        servers: &[(String, SocketAddr)],
        cfg: ClientConfig,
    ) -> Result<Cluster, ConnectError> {
        if servers.is_empty() {
            return Err(ConnectError::NoServers);
        }
        let servers = servers
            .iter()
            .map(|(name, addr)| Ok((name.clone(), Client::start(*addr, cfg.clone())?)))
            .collect::<Result<Vec<_>, ConnectError>>()?;
        Ok(Cluster { servers })
    }

    /// As [`Cluster::start`], then waits (up to `connect_timeout`) until every
    /// server is connected; fails with the first server that is not.
    pub async fn connect(
        servers: &[(String, SocketAddr)],
        cfg: ClientConfig,
    ) -> Result<Cluster, ConnectError> {
        if servers.is_empty() {
            return Err(ConnectError::NoServers);
        }
        let mut clients = Vec::with_capacity(servers.len());
        for (name, addr) in servers {
            clients.push((name.clone(), Client::connect(*addr, cfg.clone()).await?));
        }
        Ok(Cluster { servers: clients })
    }

    /// The client of the server that holds `model`.
    pub fn server_for(&self, model: &str) -> &Client {
        let names: Vec<&str> = self.servers.iter().map(|(n, _)| n.as_str()).collect();
        // Cannot panic: `place` returns an index into the list, which the
        // constructors keep non-empty.
        &self.servers[place(model, &names).unwrap_or(0)].1
    }

    /// The servers, by name.
    pub fn servers(&self) -> impl Iterator<Item = (&str, &Client)> {
        self.servers.iter().map(|(n, c)| (n.as_str(), c))
    }

    /// [`Client::lookup`] on the model's server.
    pub async fn lookup(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
    ) -> Result<LookupResult, ClientError> {
        self.server_for(model).lookup(model, key, candidates).await
    }

    /// [`Client::insert`] on the model's server.
    pub async fn insert(&self, model: &str, key: &[u64], pod: &str) -> Result<(), ClientError> {
        self.server_for(model).insert(model, key, pod).await
    }

    /// Removes the pod on every server; whether any knew it. Fails if any
    /// server fails (the others have still removed it).
    pub async fn remove_pod(&self, pod: &str) -> Result<bool, ClientError> {
        let mut found = false;
        let mut first_err = None;
        for (_, c) in &self.servers {
            match c.remove_pod(pod).await {
                Ok(f) => found |= f,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(found), Err)
    }

    /// Sets the pod's capacity on every server.
    pub async fn set_pod_capacity(&self, pod: &str, blocks: u64) -> Result<(), ClientError> {
        for (_, c) in &self.servers {
            c.set_pod_capacity(pod, blocks).await?;
        }
        Ok(())
    }

    /// Statistics summed over every server (pods counted once per server).
    pub async fn stats(&self) -> Result<WireStats, ClientError> {
        let mut sum = WireStats::default();
        for (_, c) in &self.servers {
            let s = c.stats().await?;
            sum.models += s.models;
            sum.pods += s.pods;
            sum.nodes += s.nodes;
            sum.tree_blocks += s.tree_blocks;
            sum.entries += s.entries;
            sum.bytes += s.bytes;
        }
        Ok(sum)
    }

    /// Lookups and inserts grouped per server into one batch each, sent
    /// concurrently; replies come back in the order of `ops`. Ops without a
    /// model (pod removal, capacity, stats, ping) are refused here: they
    /// concern every server, so use the dedicated calls.
    pub async fn batch(&self, ops: Vec<Op>) -> Result<Vec<Reply>, ClientError> {
        let names: Vec<&str> = self.servers.iter().map(|(n, _)| n.as_str()).collect();
        let mut groups: Vec<(Vec<usize>, Vec<Op>)> = vec![Default::default(); self.servers.len()];
        for (i, op) in ops.into_iter().enumerate() {
            let model = match &op {
                Op::Lookup { model, .. } | Op::Insert { model, .. } => model,
                other => {
                    return Err(ClientError::Protocol(format!(
                        "a cluster batch carries only lookups and inserts, not {other:?}"
                    )))
                }
            };
            let s = place(model, &names).unwrap_or(0);
            groups[s].0.push(i);
            groups[s].1.push(op);
        }
        let total: usize = groups.iter().map(|g| g.0.len()).sum();
        let mut calls = tokio::task::JoinSet::new();
        for (s, (slots, ops)) in groups.into_iter().enumerate() {
            if !slots.is_empty() {
                let client = self.servers[s].1.clone();
                calls.spawn(async move { (slots, client.batch(ops).await) });
            }
        }
        let mut replies: Vec<Option<Reply>> = vec![None; total];
        while let Some(joined) = calls.join_next().await {
            let (slots, result) =
                joined.map_err(|e| ClientError::Protocol(format!("batch task failed: {e}")))?;
            for (slot, reply) in slots.into_iter().zip(result?) {
                replies[slot] = Some(reply);
            }
        }
        replies
            .into_iter()
            .map(|r| r.ok_or_else(|| ClientError::Protocol("missing batch reply".into())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_stable_and_spread() {
        let three = ["a:7070", "b:7070", "c:7070"];
        let mut count = [0usize; 3];
        for m in 0..3000 {
            let model = format!("model-{m}");
            let s = place(&model, &three).unwrap();
            assert_eq!(place(&model, &three), Some(s), "deterministic");
            count[s] += 1;
            // Removing another server never moves this model.
            let others: Vec<&str> = three
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != (s + 1) % 3)
                .map(|(_, n)| *n)
                .collect();
            assert_eq!(others[place(&model, &others).unwrap()], three[s]);
        }
        assert!(count.iter().all(|&c| c > 800), "spread: {count:?}");
        assert_eq!(place("m", &[] as &[&str]), None);
    }
}
