//! Who may connect: the right ALPN, a trusted server certificate, and with
//! `--client-ca`, a client certificate signed by that CA.

use prefix_testkit::server as common;

use std::path::Path;
use std::sync::Arc;

use prefix_client::{Client, ClientError, TlsConfig};
use prefix_testkit::tls::{fingerprint, Ca, Roles};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_alpn_is_refused() {
    let server = common::start(|_| {}).await;
    let roots = prefix_client::load_certs(&server.ca).unwrap();
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    let refused = ep.connect(server.addr, "localhost").unwrap().await;
    assert!(refused.is_err(), "a client without our ALPN connected");
    // A proper client still gets in.
    server.client().await.ping().await.unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_server_certificate_is_refused() {
    let server = common::start(|_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let other = Ca::new("someone else").write(dir.path(), "other.pem");
    let cfg = prefix_client::ClientConfig {
        tls: TlsConfig::from_files(&other, None, None).unwrap(),
        ..server.client_config()
    };
    let e = Client::connect(server.addr, cfg).await.unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_signed_clients() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("gateways");
    let ca_path = ca.write(dir.path(), "clients-ca.pem");
    let (cert, key) = ca.client(dir.path(), "gateway-1");
    let rogue = Ca::new("rogue");
    let (rogue_cert, rogue_key) = rogue.client(dir.path(), "intruder");

    let server = common::start(|cfg| cfg.transport.client_ca = Some(ca_path.clone())).await;

    let signed = prefix_client::ClientConfig {
        tls: TlsConfig::from_files(&server.ca, Some(&cert), Some(&key)).unwrap(),
        ..server.client_config()
    };
    let c = Client::connect(server.addr, signed).await.unwrap();
    c.insert("m", &[1], "p").await.unwrap();

    // Without a certificate, or with one from another CA: TLS 1.3 lets the
    // client finish its handshake before the server checks, so the refusal
    // may show at connect or only on the first request. Either way no
    // request gets through.
    for (what, tls) in [
        (
            "no certificate",
            TlsConfig::from_files(&server.ca, None, None).unwrap(),
        ),
        (
            "a certificate from another CA",
            TlsConfig::from_files(&server.ca, Some(&rogue_cert), Some(&rogue_key)).unwrap(),
        ),
    ] {
        let cfg = prefix_client::ClientConfig {
            tls,
            ..server.client_config()
        };
        match Client::connect(server.addr, cfg).await {
            Err(_) => {}
            Ok(client) => {
                let e = client.insert("m", &[2], "intruder").await.unwrap_err();
                assert!(matches!(e, ClientError::Disconnected { .. }), "{what}: {e}");
            }
        }
    }
    assert_eq!(server.index.stats().entries, 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_may_look_up_but_not_write_and_strangers_may_do_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let roles = Roles::new(dir.path());
    let Roles {
        ca: ca_path,
        reader: (ro_cert, ro_key),
        writer: (rw_cert, rw_key),
        unlisted: (other_cert, other_key),
    } = roles.clone();
    let writer_id = fingerprint(&rw_cert);

    let server = common::start(|cfg| {
        cfg.transport.client_ca = Some(ca_path.clone());
        cfg.roles.readers = vec!["cn:gw-readonly".parse().unwrap()];
        cfg.roles.writers = vec![writer_id.parse().unwrap()];
    })
    .await;
    let connect = async |cert: &Path, key: &Path| {
        let cfg = prefix_client::ClientConfig {
            tls: TlsConfig::from_files(&server.ca, Some(cert), Some(key)).unwrap(),
            ..server.client_config()
        };
        Client::connect(server.addr, cfg).await.unwrap()
    };
    let writer = connect(&rw_cert, &rw_key).await;
    let reader = connect(&ro_cert, &ro_key).await;
    let stranger = connect(&other_cert, &other_key).await;

    writer.insert("m", &[1, 2, 3], "pod-a").await.unwrap();
    writer.set_pod_capacity("pod-a", 100).await.unwrap();
    let before = server.index.stats();

    // The reader looks up, pings and reads stats...
    let found = reader.lookup("m", &[1, 2, 3], None).await.unwrap();
    assert_eq!(found.matches.len(), 1);
    reader.ping().await.unwrap();
    reader.stats().await.unwrap();
    // ...but every write is refused with Forbidden, and changes nothing.
    let forbidden = |e: ClientError, what: &str| match e {
        ClientError::Server { code, message } => {
            assert_eq!(
                code,
                prefix_client::wire::ErrorCode::Forbidden as u16,
                "{what}: {message}"
            );
            message
        }
        other => panic!("{what}: {other}"),
    };
    let msg = forbidden(
        reader.insert("m", &[9, 9], "pod-b").await.unwrap_err(),
        "insert",
    );
    assert!(msg.contains("reader"), "{msg}");
    forbidden(reader.remove_pod("pod-a").await.unwrap_err(), "remove_pod");
    forbidden(
        reader.set_pod_capacity("pod-a", 1).await.unwrap_err(),
        "set_pod_capacity",
    );
    // In a batch, the reader's lookups are answered and its insert refused.
    use prefix_client::wire::{Op, Reply};
    let replies = reader
        .batch(vec![
            Op::Lookup {
                model: "m".into(),
                key: vec![1, 2],
                candidates: None,
            },
            Op::Insert {
                model: "m".into(),
                key: vec![7],
                pod: "pod-c".into(),
            },
        ])
        .await
        .unwrap();
    assert!(matches!(&replies[0], Reply::Lookup { matches, .. } if matches.len() == 1));
    assert!(
        matches!(&replies[1], Reply::Error { code, .. } if *code == prefix_client::wire::ErrorCode::Forbidden as u16)
    );

    // A certificate signed by the CA but on neither list may do nothing; the
    // refusal names its fingerprint so the operator can add it.
    let msg = forbidden(
        stranger.lookup("m", &[1], None).await.unwrap_err(),
        "lookup",
    );
    let hex = fingerprint(&other_cert)[7..]
        .replace(':', "")
        .to_lowercase();
    assert!(msg.contains(&hex), "{msg}");
    forbidden(
        stranger.insert("m", &[5], "pod-x").await.unwrap_err(),
        "insert",
    );

    let after = server.index.stats();
    assert_eq!((after.entries, after.pods), (before.entries, before.pods));
    assert_eq!(server.index.pod_blocks("pod-a"), 3);
    server.shutdown().await;
}
