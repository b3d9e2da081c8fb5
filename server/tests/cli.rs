//! The `prefix-client` command line against a real server: every failure
//! says why, on stdout as JSON for what the server (or the client's own limit
//! check) answered, on stderr in words for what never reached an answer.

use prefix_testkit::server as common;
use prefix_testkit::server::client_bin;

use std::path::Path;
use std::process::Command;

use prefix_testkit::tls::{Ca, Roles};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `prefix-client` against `server` with `tls` (CA, then an optional
/// certificate and key) and `args`.
async fn run(addr: std::net::SocketAddr, tls: &[&Path], args: &[&str]) -> Run {
    let mut cmd = Command::new(client_bin());
    cmd.args(["--server", &addr.to_string()]);
    cmd.arg("--ca").arg(tls[0]);
    if let [_, cert, key] = tls {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    cmd.args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The JSON answer of a failed op: `{"ok":false,"error":...}`, exit code 1.
fn refused(r: &Run) -> String {
    assert_eq!(r.code, 1, "stdout {:?} stderr {:?}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON answer on stdout ({e}): {:?} / {:?}",
            r.stdout, r.stderr
        )
    });
    assert_eq!(v["ok"], false);
    // The whole error object: its code, name and message.
    v["error"].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_ops_print_their_reason() {
    // A key limit a command line can pass (one argument holds 128 KiB).
    let server = common::start(|cfg| cfg.index.max_key_blocks = 2048).await;
    let ca = [server.ca.as_path()];
    let ok = run(
        server.addr,
        &ca,
        &["insert", "--model", "m", "--hashes", "1,2", "--pod", "p"],
    )
    .await;
    assert_eq!((ok.code, ok.stdout.trim()), (0, r#"{"ok":true}"#));

    let empty = run(
        server.addr,
        &ca,
        &["insert", "--model", "", "--hashes", "1", "--pod", "p"],
    )
    .await;
    let why = refused(&empty);
    assert!(why.contains("name of 0 bytes"), "{why}");

    let hashes: Vec<String> = (0..3000).map(|h| h.to_string()).collect();
    let long = run(
        server.addr,
        &ca,
        &["lookup", "--model", "m", "--hashes", &hashes.join(",")],
    )
    .await;
    let why = refused(&long);
    assert!(
        why.contains("key of 3000 blocks exceeds max_key_blocks = 2048")
            && why.contains("key_too_long"),
        "{why}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_under_mutual_tls_print_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let roles = Roles::new(dir.path());
    let Roles {
        reader: (ro_cert, ro_key),
        writer: (rw_cert, rw_key),
        unlisted: (other_cert, other_key),
        ..
    } = roles.clone();
    let foreign = Ca::new("somebody else");
    let (alien_cert, alien_key) = foreign.client(dir.path(), "gw-alien");
    let server = common::start(|cfg| {
        roles.configure(cfg);
    })
    .await;
    let srv = server.ca.as_path();
    let insert = ["insert", "--model", "m", "--hashes", "1", "--pod", "p"];
    let lookup = ["lookup", "--model", "m", "--hashes", "1"];

    let ok = run(server.addr, &[srv, &rw_cert, &rw_key], &insert).await;
    assert_eq!(ok.code, 0, "{} {}", ok.stdout, ok.stderr);

    let why = refused(&run(server.addr, &[srv, &ro_cert, &ro_key], &insert).await);
    assert!(
        why.contains(r#""code":12,"name":"forbidden""#) && why.contains("reader"),
        "{why}"
    );

    let why = refused(&run(server.addr, &[srv, &other_cert, &other_key], &lookup).await);
    assert!(
        why.contains("CN=gw-unlisted") && why.contains("has no role"),
        "{why}"
    );

    // Neither reaches an answer: the server refuses the handshake.
    for (what, tls) in [
        (
            "a certificate of another CA",
            vec![srv, alien_cert.as_path(), alien_key.as_path()],
        ),
        ("no certificate", vec![srv]),
    ] {
        let r = run(server.addr, &tls, &lookup).await;
        assert_ne!(r.code, 0, "{what}");
        let said = format!("{}{}", r.stdout, r.stderr);
        eprintln!("{what}: {said:?}");
        assert!(said.contains("certificate"), "{what}: {said:?}");
    }
    server.shutdown().await;
}

/// The openssl recipe of `docs/operations.md`, run as written: its
/// certificates serve mutual TLS with a writer and a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_openssl_recipe_makes_working_certificates() {
    let doc = include_str!("../../docs/operations.md");
    let recipe = doc
        .split("<!-- recipe: mutual-tls -->\n```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the recipe in docs/operations.md");
    let dir = tempfile::tempdir().unwrap();
    let script = recipe.to_string();
    let cwd = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .args(["-euc", &script])
            .current_dir(cwd)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = |name: &str| dir.path().join(name);
    let server = common::start(|cfg| {
        cfg.transport.tls = prefix_server::config::CertSource::Files {
            cert: p("server.pem"),
            key: p("server.key"),
        };
        cfg.transport.client_ca = Some(p("ca.pem"));
        cfg.roles.writers = vec!["cn:epp-writer".parse().unwrap()];
        cfg.roles.readers = vec!["cn:dashboard".parse().unwrap()];
    })
    .await;
    let (ca, w, wk, r, rk) = (
        p("ca.pem"),
        p("epp-writer.pem"),
        p("epp-writer.key"),
        p("dashboard.pem"),
        p("dashboard.key"),
    );
    let insert = [
        "insert", "--model", "m", "--hashes", "1,2", "--pod", "pod-a",
    ];
    let ok = run(server.addr, &[&ca, &w, &wk], &insert).await;
    assert_eq!(
        (ok.code, ok.stdout.trim()),
        (0, r#"{"ok":true}"#),
        "{}",
        ok.stderr
    );
    let found = run(
        server.addr,
        &[&ca, &r, &rk],
        &["lookup", "--model", "m", "--hashes", "1,2"],
    )
    .await;
    assert_eq!(found.code, 0, "{}", found.stderr);
    assert!(
        found.stdout.contains(r#""pod":"pod-a","blocks":2"#),
        "{}",
        found.stdout
    );
    let why = refused(&run(server.addr, &[&ca, &r, &rk], &insert).await);
    assert!(why.contains("reader"), "{why}");
    server.shutdown().await;
}

/// The engine subcommands against a real server: subscribe (refused with the
/// reason, then accepted), list-engines, unsubscribe, each printing JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_are_followed_from_the_command_line() {
    let server = common::start(|_| {}).await;
    let ca = [server.ca.as_path()];
    // Nothing listens on port 1: the subscription keeps reconnecting.
    let subscribe = [
        "subscribe",
        "--pod",
        "vllm-0",
        "--model",
        "m",
        "--endpoint",
        "tcp://127.0.0.1:1",
    ];
    let bad = [&subscribe[..], &["--block-size", "24"]].concat();
    let why = refused(&run(server.addr, &ca, &bad).await);
    assert!(
        why.contains(r#""name":"bad_subscription""#) && why.contains("engine block of 24 tokens"),
        "{why}"
    );

    let ok = run(
        server.addr,
        &ca,
        &[&subscribe[..], &["--media", "gpu,cpu"]].concat(),
    )
    .await;
    assert_eq!(
        (ok.code, ok.stdout.trim()),
        (0, r#"{"ok":true}"#),
        "{}",
        ok.stderr
    );
    let listed = run(server.addr, &ca, &["list-engines"]).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let v: serde_json::Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    let engines = v["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 1, "{v}");
    let e = &engines[0];
    assert_eq!(
        (&e["pod"], &e["endpoint"], &e["block_size"], &e["media"]),
        (
            &serde_json::json!("vllm-0"),
            &serde_json::json!("tcp://127.0.0.1:1"),
            &serde_json::json!(16),
            &serde_json::json!(["GPU", "CPU"])
        ),
        "{v}"
    );
    assert_eq!(e["last_seq"], serde_json::Value::Null, "{v}");

    let unsubscribe = ["unsubscribe", "--pod", "vllm-0"];
    let gone = run(server.addr, &ca, &unsubscribe).await;
    assert_eq!(gone.stdout.trim(), r#"{"ok":true,"removed":true}"#);
    let again = run(server.addr, &ca, &unsubscribe).await;
    assert_eq!(again.stdout.trim(), r#"{"ok":true,"removed":false}"#);
    assert!(server.engines_list().is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_counts_the_sampled_lookups_replicas_answer_differently() {
    let a = common::start(|_| {}).await;
    let (cert, key) = (a.ca.clone(), a.dir.path().join("key.pem"));
    let b = common::start(move |cfg| {
        cfg.transport.tls = prefix_server::config::CertSource::Files { cert, key };
    })
    .await;
    let now = prefix_server::now_ms();
    // 100 keys on both, 100 more on `a` alone.
    for k in 0..200u64 {
        let key = [k << 8, k << 8 | 1, k << 8 | 2];
        a.index.insert("m", &key, "p", now).unwrap();
        if k < 100 {
            b.index.insert("m", &key, "p", now).unwrap();
        }
    }
    let servers = [a.addr.to_string(), b.addr.to_string()];
    let args = |examples: &'static str| {
        let mut v = vec!["compare", "--samples", "400", "--examples", examples];
        v.extend(servers.iter().map(String::as_str));
        v
    };
    let r = run(a.addr, &[&a.ca], &args("1000")).await;
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let c = &v["compare"];
    // Entries count (pod, block) pairs: 3 per key.
    assert_eq!(c["servers"][0]["stats"]["entries"], 600);
    assert_eq!(c["servers"][1]["stats"]["entries"], 300);
    let (sampled, differing) = (
        c["sampled"].as_u64().unwrap(),
        c["differing"].as_u64().unwrap(),
    );
    // Keys come from both servers' content; those `a` alone holds differ,
    // and only those.
    let examples = c["examples"].as_array().unwrap();
    assert_eq!(examples.len() as u64, differing);
    assert!(differing > 0 && sampled > differing, "{c}");
    for e in examples {
        let first = e["hashes"][0].as_u64().unwrap() >> 8;
        assert!(first >= 100, "{e}");
        assert_eq!(e["answers"][1]["matches"], serde_json::json!([]), "{e}");
    }
    assert_eq!(
        c["servers"][1]["differs_from_first"].as_u64(),
        Some(differing)
    );
    let share = c["share_differing"].as_f64().unwrap();
    assert!((share - differing as f64 / sampled as f64).abs() < 1e-9);
    // Once `b` has them too, the replicas agree.
    for k in 100..200u64 {
        b.index
            .insert("m", &[k << 8, k << 8 | 1, k << 8 | 2], "p", now)
            .unwrap();
    }
    let r = run(a.addr, &[&a.ca], &args("5")).await;
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["compare"]["differing"], 0, "{v}");
    a.shutdown().await;
    b.shutdown().await;
}

/// A hard open-file limit below what `--max-engines` needs stops the
/// server at start with what to do, rather than leaving engines it cannot
/// follow; the same limit with fewer engines starts.
#[test]
fn an_open_file_limit_below_max_engines_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let run = |max_engines: &str| {
        let script = format!(
            "ulimit -n 1000 && ulimit -Hn 1000 && exec \"$0\" --listen 127.0.0.1:0 --metrics-listen off --data-dir {} --max-engines {max_engines}",
            dir.path().display()
        );
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg(prefix_testkit::server_bin!())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A server that starts runs until stopped: give it a moment.
        for _ in 0..100 {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
                return Some((status, err));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        None
    };
    let (status, err) = run("1000").expect("the server refuses to start");
    assert!(!status.success());
    assert!(
        err.contains("the open-file limit is 1000, and --max-engines 1000 needs")
            && err.contains("ulimit -Hn"),
        "{err}"
    );
    assert!(run("100").is_none(), "a server within the limit starts");
}

/// At the open-file limit the server follows the engines whose sockets fit
/// and refuses the rest as they are subscribed, with the reason: engines at
/// one address under one topic each need a socket of their own (a group),
/// and the limit leaves room for four beyond the shard's first. Each engine
/// followed gets its events through; an engine unsubscribed gives its room
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_past_the_open_file_limit_are_refused_and_the_rest_followed() {
    use prefix_proto::{ErrorCode, Op, Reply};
    use prefix_testkit::publisher::{own_prompt, stored_batch, Publisher};
    const BLOCK: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let (addr, http) = common::free_ports();
    let flags = "--max-engines 32 --max-engine-replays 4 --engine-threads 1";
    let flags: Vec<&str> = flags.split(' ').collect();
    // What the rest of the server may hold, and room for four watched
    // sockets (what each engine named by host name wants more).
    let mut cfg = prefix_server::ServerConfig::default();
    (
        cfg.engines.max_engines,
        cfg.engines.max_replays,
        cfg.engines.threads,
    ) = (32, 4, 1);
    let needs = prefix_server::open_files_needed(&cfg);
    let watched = (needs.wanted - needs.required) / 32;
    let limit = needs.required + 4 * watched;
    let bin = prefix_testkit::server_bin!();
    let mut server = common::Proc::start_limited(bin, dir.path(), addr, http, &flags, limit);
    let client = server.client().await;
    let ctx = zmq::Context::new();
    let engines: Vec<Publisher> = (0..8).map(|_| Publisher::bind(&ctx, "")).collect();
    let sub = |i: usize| prefix_server::Subscription {
        pod: format!("vllm-{i}"),
        model: "m".into(),
        endpoint: engines[i].endpoint.clone(),
        replay: None,
        block_size: BLOCK as u32,
        topic: String::new(),
        media: vec!["GPU".into()],
    };
    let replies = client
        .batch((0..8).map(|i| Op::Subscribe(sub(i))).collect())
        .await
        .unwrap();
    let refusal = |r: &Reply| match r {
        Reply::Error { code, message } => {
            assert_eq!(*code, ErrorCode::BadSubscription as u16, "{message}");
            assert!(
                message.contains("not enough open files") && message.contains("ulimit -Hn"),
                "{message}"
            );
            true
        }
        other => {
            assert_eq!(other, &Reply::Done);
            false
        }
    };
    let refused: Vec<bool> = replies.iter().map(refusal).collect();
    assert_eq!(
        refused,
        [false, false, false, false, false, true, true, true]
    );
    // One by one, the same.
    let one = client.subscribe_engine(sub(5)).await.unwrap_err();
    assert!(one.to_string().contains("not enough open files"), "{one}");
    // Room given back: the next engine fits.
    assert!(client.unsubscribe_engine("vllm-0").await.unwrap());
    client.subscribe_engine(sub(5)).await.unwrap();
    let followed = [1, 2, 3, 4, 5];
    let listed = client.list_engines().await.unwrap();
    let mut pods: Vec<&str> = listed.iter().map(|e| &*e.sub.pod).collect();
    pods.sort();
    assert_eq!(pods, followed.map(|i| format!("vllm-{i}")));
    // Every engine followed is heard.
    for i in followed {
        engines[i].subscribed();
        engines[i].publish(0, &stored_batch(own_prompt(i, 2, BLOCK), BLOCK));
    }
    for i in followed {
        let key = prefix_proto::key::token_key(&own_prompt(i, 2, BLOCK), BLOCK);
        prefix_testkit::server::eventually("each engine followed is heard", async || {
            let got = client.lookup("m", &key, None).await.unwrap();
            got.matches
                .iter()
                .any(|m| *m.pod == format!("vllm-{i}") && m.blocks == 2)
        })
        .await;
    }
}
