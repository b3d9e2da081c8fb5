//! The service over loopback QUIC: how requests should travel.
//!
//! `transport_1024_lookups` sends 1,024 lookups (32-block keys, 16 pods in
//! each answer) from 64 concurrent tasks, 16 each, and compares:
//! - `lanes_4`, `lanes_2`, `lanes_1`: the client library, pipelining frames
//!   on 4, 2 or 1 (the default) long-lived streams;
//! - `stream_per_request`: a new QUIC stream for every request (the baseline
//!   the protocol's design rejects);
//! - `batch_16`: the library again, 16 lookups per frame.
//!
//! `round_trip` is one ping at a time: the latency floor of a call.
//! Server and client share this process and its runtime (2 worker threads),
//! as they share the machine's 2 cores in any loopback test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use prefix_benches::{pod_names, ChatWorkload};
use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_proto::{self as wire, Limits, Op, Request, Response};
use prefix_server::{Server, ServerConfig};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TASKS: usize = 64;
const PER_TASK: usize = 16;
const MODEL: &str = "llama";

struct Setup {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    tls: TlsConfig,
    keys: Arc<Vec<Vec<u64>>>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ServerConfig {
        data_dir: dir.path().into(),
        ..ServerConfig::default()
    };
    cfg.transport.listen = "127.0.0.1:0".parse().expect("addr");
    cfg.transport.metrics_listen = None;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, index) = rt.block_on(async {
        let server = Server::bind(cfg).await.expect("bind");
        let out = (server.local_addr(), server.index().clone());
        tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        out
    });
    // 16 pods share each conversation's prefixes, as in the index benches.
    let w = ChatWorkload::new(2000, 7, false);
    let keys = w.keys_of_len(32, 1024);
    let pods = pod_names();
    for k in &keys {
        for (i, pod) in pods.iter().enumerate() {
            index
                .insert(MODEL, &k[..k.len() - i % 4], pod, now())
                .expect("insert");
        }
    }
    let tls = TlsConfig::from_files(&dir.path().join("cert.pem"), None, None).expect("ca");
    Setup {
        rt,
        addr,
        tls,
        keys: Arc::new(keys),
        _dir: dir,
        _stop: stop,
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

fn client(s: &Setup, streams: usize) -> Client {
    let cfg = ClientConfig {
        tls: s.tls.clone(),
        deadline: Duration::from_secs(5),
        streams,
        ..ClientConfig::default()
    };
    s.rt.block_on(Client::connect(s.addr, cfg))
        .expect("connect")
}

fn lookup(key: &[u64]) -> Op {
    Op::Lookup {
        model: MODEL.into(),
        key: key.to_vec(),
        candidates: None,
    }
}

/// 64 tasks × 16 calls of `f(task, i)`, all awaited.
async fn fan_out<F, Fut>(f: F)
where
    F: Fn(usize, usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let calls: Vec<Fut> = (0..PER_TASK).map(|i| f(t, i)).collect();
        set.spawn(async move {
            for c in calls {
                c.await;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
}

fn transport(c: &mut Criterion) {
    let s = setup();
    let mut g = c.benchmark_group("transport_1024_lookups");
    g.throughput(Throughput::Elements((TASKS * PER_TASK) as u64));
    for streams in [4, 2, 1] {
        let cl = client(&s, streams);
        g.bench_function(format!("lanes_{streams}"), |b| {
            b.iter(|| {
                s.rt.block_on(fan_out(|t, i| {
                    let (cl, keys) = (cl.clone(), s.keys.clone());
                    async move {
                        let k = &keys[(t * PER_TASK + i) % keys.len()];
                        let r = cl.lookup(MODEL, k, None).await.expect("lookup");
                        assert_eq!(r.matches.len(), 16);
                    }
                }))
            })
        });
    }

    // One QUIC stream per request, on a raw connection.
    let conn = s.rt.block_on(async {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("ep");
        ep.set_default_client_config(s.tls.quic_config().expect("tls"));
        ep.connect(s.addr, "localhost")
            .expect("connect")
            .await
            .expect("handshake")
    });
    g.bench_function("stream_per_request", |b| {
        b.iter(|| {
            s.rt.block_on(fan_out(|t, i| {
                let (conn, keys) = (conn.clone(), s.keys.clone());
                async move {
                    let k = &keys[(t * PER_TASK + i) % keys.len()];
                    let mut frame = Vec::new();
                    wire::encode_request(1, &Request::One(lookup(k)), &mut frame);
                    let (mut send, mut recv) = conn.open_bi().await.expect("open");
                    send.write_all(&frame).await.expect("write");
                    send.finish().expect("finish");
                    let bytes = recv.read_to_end(1 << 20).await.expect("read");
                    let f = wire::split_frame(&bytes, Limits::default().max_frame_bytes)
                        .expect("frame")
                        .expect("whole");
                    let r = wire::decode_response(f.payload).expect("decode");
                    assert!(matches!(r, Response::One(_)));
                }
            }))
        })
    });

    let cl = client(&s, 1);
    g.bench_function("batch_16", |b| {
        b.iter(|| {
            // 64 frames of 16 lookups: the same 1,024 lookups.
            s.rt.block_on(fan_out(|t, i| {
                let (cl, keys) = (cl.clone(), s.keys.clone());
                async move {
                    if i > 0 {
                        return;
                    }
                    let ops = (0..PER_TASK)
                        .map(|j| lookup(&keys[(t * PER_TASK + j) % keys.len()]))
                        .collect();
                    let r = cl.batch(ops).await.expect("batch");
                    assert_eq!(r.len(), PER_TASK);
                }
            }))
        })
    });
    g.finish();

    let mut g = c.benchmark_group("round_trip");
    g.throughput(Throughput::Elements(1));
    let cl = client(&s, 1);
    g.bench_function("ping", |b| {
        b.iter(|| s.rt.block_on(cl.ping()).expect("ping"))
    });
    g.finish();
}

criterion::criterion_group!(benches, transport);
criterion::criterion_main!(benches);
