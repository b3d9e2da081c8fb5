use std::time::Duration;

use prefix_proto::MAX_FRAME_CEILING;

use super::*;

#[test]
fn flags_override_file_override_defaults() {
    let file: Settings = toml::from_str(
        r#"
        listen = "0.0.0.0:9000"
        ttl = 60
        sweep-interval = "250ms"
        metrics-listen = "off"
        "#,
    )
    .unwrap();
    let mut flags = Settings::default();
    flags.index.ttl = Some(30);
    let cfg = flags.or(file).resolve().unwrap();
    assert_eq!(cfg.transport.listen, "0.0.0.0:9000".parse().unwrap());
    assert_eq!(cfg.index.ttl, Duration::from_secs(30));
    assert_eq!(cfg.upkeep.sweep_interval, Duration::from_millis(250));
    assert_eq!(cfg.transport.metrics_listen, None);
    assert_eq!(cfg.index.pod_capacity, 31_250);
    assert_eq!(cfg.transport.tls, CertSource::SelfSigned);
}

#[test]
fn unknown_keys_and_bad_values_are_refused() {
    let unknown = Settings::from_toml("tll = 5", Path::new("t.toml"));
    assert!(
        matches!(&unknown, Err(ConfigError::Unknown { key, .. }) if key == "tll"),
        "{unknown:?}"
    );
    for (text, key) in [("ttl = \"x\"", "ttl"), ("engines = \"pod=a\"", "engines")] {
        let text = format!("listen = \"127.0.0.1:1\"\n{text}");
        let bad = Settings::from_toml(&text, Path::new("t.toml"));
        assert!(
            matches!(&bad, Err(ConfigError::Value { key: k, .. }) if k == key),
            "{bad:?}"
        );
    }
    let mut s = Settings::default();
    s.limits.max_frame_bytes = Some(MAX_FRAME_CEILING + 1);
    assert!(matches!(s.resolve(), Err(ConfigError::Invalid { .. })));
    let mut s = Settings::default();
    s.transport.metrics_listen = Some("nowhere".into());
    assert!(s.resolve().is_err());
    for (s, flag) in [
        (
            IndexSettings {
                max_engine_blocks: Some(0),
                ..IndexSettings::default()
            },
            "max-engine-blocks ",
        ),
        (
            IndexSettings {
                max_engine_blocks_per_pod: Some(0),
                ..IndexSettings::default()
            },
            "max-engine-blocks-per-pod",
        ),
    ] {
        let s = Settings {
            index: s,
            ..Settings::default()
        };
        let err = s.resolve().unwrap_err().to_string();
        assert!(err.contains(flag), "{err}");
    }
    assert!(Settings::default().resolve().is_ok());
}

#[test]
fn busy_polling_is_off_by_default_and_0s_turns_it_off() {
    let on = |toml_text: &str| {
        Settings::from_toml(toml_text, Path::new("t.toml"))
            .unwrap()
            .resolve()
            .unwrap()
            .transport
            .busy_poll
    };
    assert_eq!(on(""), None);
    assert_eq!(on(r#"busy-poll = "0s""#), None);
    assert_eq!(
        on(r#"busy-poll = "100ms""#),
        Some(Duration::from_millis(100))
    );
}

/// A configuration with every setting away from its default.
fn everything_changed() -> ServerConfig {
    let d = ServerConfig::default();
    ServerConfig {
        data_dir: "/var/lib/x".into(),
        transport: TransportConfig {
            listen: "0.0.0.0:9000".parse().unwrap(),
            metrics_listen: None,
            http_listen: Some("0.0.0.0:8443".parse().unwrap()),
            // Plain HTTP cannot stand beside `client_ca`; see
            // `plain_http_maps_both_ways`.
            http_plaintext: false,
            tls: CertSource::Files {
                cert: "c.pem".into(),
                key: "k.pem".into(),
            },
            client_ca: Some("ca.pem".into()),
            max_connections: 15,
            max_streams: 16,
            idle_timeout: Duration::from_secs(17),
            read_timeout: Duration::from_millis(2500),
            write_timeout: Duration::from_millis(3500),
            connection_window: 1 << 17,
            busy_poll: Some(Duration::from_micros(230)),
            drain_timeout: Duration::from_secs(21),
            close_timeout: Duration::from_millis(1500),
        },
        limits: LimitsConfig {
            max_frame_bytes: 4096,
            http_max_body_bytes: 4096,
            max_batch: 13,
            max_candidates: 14,
            inline_blocks: 20,
            max_in_flight: 22,
        },
        index: IndexConfig {
            ttl: Duration::from_secs(61),
            pod_capacity: 7,
            max_blocks: 8,
            max_key_blocks: 9,
            max_pods: 10,
            max_models: 11,
            max_name_len: 12,
            speculative_ttl: Duration::from_millis(2500),
            max_engine_blocks: 24,
            max_engine_blocks_per_pod: 23,
            max_block_ratio: 32,
            max_engine_groups: 5,
            receipts: prefix_index::ReceiptRule {
                window: 25,
                suspect: 6,
                quiet: Duration::from_secs(26),
                tolerance: 1,
            },
            ..d.index
        },
        upkeep: Upkeep {
            sweep_interval: Duration::from_millis(180),
            sweep_budget: 19,
            snapshot_interval: None,
        },
        roles: Roles {
            readers: vec!["cn:r".parse().unwrap()],
            writers: vec![
                "cn:w".parse().unwrap(),
                format!("sha256:{}", "ab".repeat(32)).parse().unwrap(),
            ],
            peers: vec!["cn:index".parse().unwrap()],
        },
        replicas: ReplicaConfig {
            peers: vec!["index-1.index:7070".into(), "10.0.0.2:7070".into()],
            peer_ca: Some("peer-ca.pem".into()),
            peer_server_name: Some("index.internal".into()),
            max_age: Duration::from_secs(27),
            timeout: Duration::from_secs(28),
            retry: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(3),
            max_snapshot_bytes: 29 << 20,
            queue: 30,
            send_timeout: Duration::from_secs(31),
            send_piece_bytes: 1 << 16,
            send_pieces: 2,
            tail_window: Duration::from_secs(32),
            tail_queue: 33,
            repair_interval: Duration::from_millis(340),
            repair_budget: 35,
        },
        engines: EngineConfig {
            subscriptions: vec![
                "pod=a,model=m,endpoint=tcp://h:1,replay=tcp://h:2,block-size=32"
                    .parse()
                    .unwrap(),
                "pod=b,model=org/m,endpoint=tcp://h:3,topic=kv,media=GPU+CPU"
                    .parse()
                    .unwrap(),
            ],
            dns: crate::engines::dns::DnsConfig {
                sources: vec![
                    "srv=_kv._tcp.vllm.ns.svc,model=m,replay-port=5558,block-size=32"
                        .parse()
                        .unwrap(),
                ],
                interval: Duration::from_millis(2500),
                server: Some("10.96.0.10:53".parse().unwrap()),
            },
            listen: Some("tcp://0.0.0.0:5557".into()),
            allow: crate::engines::EngineAllow::parse(&["10.0.0.0/8".into(), "fd00::1".into()])
                .unwrap(),
            allow_moves: true,
            receipt_resync: true,
            central_block_size: 64,
            token_block: 8,
            block_aliases: crate::engines::BlockAliases::Dynamo,
            replay_timeout: Duration::from_secs(25),
            learning_period: Duration::from_secs(77),
            max_held_batches: 26,
            max_held_bytes: 1 << 22,
            decode: prefix_events::DecodeLimits {
                max_events: 29,
                max_hashes: 30,
                max_tokens: 31,
            },
            max_engines: 27,
            threads: 3,
            max_replays: 5,
            max_message_bytes: 2048,
            max_queued_messages: 28,
            poll: Duration::from_millis(50),
        },
    }
}

#[test]
fn engine_settings_are_checked() {
    let mut cfg = ServerConfig::default();
    cfg.engines.subscriptions = vec!["pod=a,model=m,endpoint=tcp://h:1,block-size=24"
        .parse()
        .unwrap()];
    let err = cfg.validate().unwrap_err().to_string();
    assert!(
        err.contains("must divide or be a multiple of token-block"),
        "{err}"
    );
    cfg.engines.subscriptions = vec![
        "pod=a,model=m,endpoint=tcp://h:1".parse().unwrap(),
        "pod=a,model=n,endpoint=tcp://h:2".parse().unwrap(),
    ];
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("two subscriptions name this pod"), "{err}");
    cfg.engines.subscriptions.clear();
    cfg.engines.dns.sources = vec!["srv=x,model=m,block-size=24".parse().unwrap()];
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("multiple of token-block"), "{err}");
    cfg.engines.dns.sources = vec![
        "srv=x,model=m".parse().unwrap(),
        "srv=x,model=n".parse().unwrap(),
    ];
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("two sources name this SRV"), "{err}");
    cfg.engines.dns.sources.pop();
    cfg.engines.dns.interval = Duration::from_millis(10);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("engine-dns-interval"), "{err}");
    let mut dns = Settings::default();
    dns.engines.engine_dns = Some(vec!["model=m".into()]);
    let err = dns.resolve().unwrap_err().to_string();
    assert!(err.contains("srv= is missing"), "{err}");
    let mut bad = Settings::default();
    bad.engines.engines = Some(vec!["pod=a,endpoint=tcp://h:1".into()]);
    let err = bad.resolve().unwrap_err().to_string();
    assert!(err.contains("model= is missing"), "{err}");
    let mut listen = Settings::default();
    listen.engines.engine_listen = Some("udp://x".into());
    assert!(listen.resolve().is_err());
    let mut allow = Settings::default();
    allow.engines.engine_allow = Some(vec!["10.0.0.0/8".into(), "engines.local".into()]);
    let err = allow.resolve().unwrap_err().to_string();
    assert!(
        err.contains("engine-allow") && err.contains("engines.local"),
        "{err}"
    );
}

#[test]
fn settings_and_configurations_map_both_ways() {
    for cfg in [ServerConfig::default(), everything_changed()] {
        assert_eq!(Settings::from(&cfg).resolve().unwrap(), cfg);
    }
    // Every setting of the changed configuration differs from the
    // default one, so no field is left out of the mapping.
    let (d, x) = (
        Settings::describe(&ServerConfig::default()),
        Settings::describe(&everything_changed()),
    );
    assert_eq!(d.len(), Settings::names().len());
    for ((name, a), (_, b)) in d.iter().zip(&x) {
        if name != "http-plaintext" {
            assert_ne!(a, b, "{name} is not mapped");
        }
    }
}

#[test]
fn plain_http_maps_both_ways() {
    let mut cfg = everything_changed();
    cfg.transport.client_ca = None;
    cfg.roles = Roles::default();
    cfg.transport.http_plaintext = true;
    assert_eq!(Settings::from(&cfg).resolve().unwrap(), cfg);
    let on = Settings::describe(&cfg);
    let off = Settings::describe(&ServerConfig::default());
    let value = |d: &[(String, String)]| {
        d.iter()
            .find(|(name, _)| *name == "http-plaintext")
            .map(|(_, v)| v.clone())
    };
    assert_ne!(value(&on), value(&off));
}

#[test]
fn settings_merge_setting_by_setting_through_toml() {
    let low = Settings::from(&everything_changed());
    let mut high = Settings::default();
    high.index.ttl = Some(5);
    high.roles.readers = Some(vec!["cn:other".into()]);
    let merged = high.clone().or(low.clone());
    assert_eq!(merged.index.ttl, Some(5));
    assert_eq!(merged.roles.readers, high.roles.readers);
    assert_eq!(merged.limits.max_batch, low.limits.max_batch);
    assert_eq!(merged.roles.writers, low.roles.writers);
    assert_eq!(Settings::default().or(low.clone()), low);
}

#[test]
fn flags_environment_and_keys_share_one_name() {
    use clap::Args as _;
    let cmd = Settings::augment(Settings::augment_args(clap::Command::new("t")));
    for arg in cmd.get_arguments() {
        let key = arg.get_id().as_str().replace('_', "-");
        let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
        assert_eq!(
            env,
            format!("PREFIX_INDEX_{}", key.to_uppercase().replace('-', "_")),
            "{key}"
        );
        let flag = arg.get_long().unwrap_or_default();
        let plural = match flag.strip_suffix('y') {
            Some(stem) => format!("{stem}ies"),
            None => format!("{flag}s"),
        };
        assert!(key == flag || key == plural, "{key} vs --{flag}");
    }
}

#[test]
fn help_shows_the_real_defaults() {
    let cmd = Settings::augment(<Settings as clap::Args>::augment_args(clap::Command::new(
        "t",
    )));
    let help = |id: &str| {
        let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
        arg.get_help().unwrap().to_string()
    };
    assert!(help("ttl").ends_with("[default: 600]"), "{}", help("ttl"));
    assert!(help("busy_poll").ends_with("[default: 0s]"));
    assert!(help("metrics_listen").ends_with("[default: 127.0.0.1:7071]"));
    assert!(!help("cert").contains("[default"));
}

/// `docs/operations.md`'s settings table lists exactly the settings,
/// each with its real default.
#[test]
fn the_operations_doc_matches_the_settings() {
    let doc = include_str!("../../../docs/operations.md");
    let table = doc
        .split("## Settings")
        .nth(1)
        .expect("a Settings section")
        .lines()
        .skip_while(|l| !l.starts_with("| flag"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    use clap::Args as _;
    let cmd = Settings::augment(Settings::augment_args(clap::Command::new("t")));
    let flag_of = |key: &str| {
        let id = key.replace('-', "_");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == id.as_str())
            .unwrap();
        format!("--{}", arg.get_long().unwrap())
    };
    let defaults: std::collections::HashMap<String, String> =
        Settings::describe(&ServerConfig::default())
            .into_iter()
            .map(|(key, value)| (flag_of(&key), value))
            .collect();
    let mut documented = Vec::new();
    for row in table {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let default = ticked(cells[2]).into_iter().next().unwrap_or("none".into());
        for flag in ticked(cells[1]) {
            let real = defaults
                .get(&flag)
                .unwrap_or_else(|| panic!("{flag} is documented but is no setting"));
            assert_eq!(&default, real, "the default of {flag}");
            documented.push(flag);
        }
    }
    let mut all: Vec<_> = defaults.into_keys().collect();
    all.sort();
    documented.sort();
    assert_eq!(documented, all, "every setting is documented once");
}

#[test]
fn a_certificate_without_its_key_is_refused() {
    for text in [r#"cert = "c.pem""#, r#"key = "k.pem""#] {
        let s = Settings::from_toml(text, Path::new("t.toml")).unwrap();
        let err = s.resolve().unwrap_err().to_string();
        assert!(err.contains("cert/key"), "{text}: {err}");
    }
    let both = Settings::from_toml("cert = \"c.pem\"\nkey = \"k.pem\"", Path::new("t.toml"));
    assert_eq!(
        both.unwrap().resolve().unwrap().transport.tls,
        CertSource::Files {
            cert: "c.pem".into(),
            key: "k.pem".into()
        }
    );
}

/// Every value a setting's rule refuses is refused in the same words: the
/// setting (or the settings refused together), the value and the rule.
#[test]
fn refused_values_say_why() {
    for (text, message) in [
        ("max-frame-bytes = 63", "max-frame-bytes = 63: must be 64 to 16777216"),
        ("http-max-body-bytes = 1023", "http-max-body-bytes = 1023: must be 1024 to 67108864"),
        ("max-batch = 0", "max-batch = 0: must be at least 1"),
        ("max-in-flight = 65537", "max-in-flight = 65537: must be 1 to 65536"),
        ("max-pods = 0", "max-pods = 0: must be 1 to 1048575"),
        ("max-key-blocks = 0", "max-key-blocks = 0: must be at least 1"),
        ("max-name-len = 0", "max-name-len = 0: must be at least 1"),
        ("max-block-ratio = 0", "max-block-ratio = 0: must be at least 1"),
        ("max-engine-groups = 65", "max-engine-groups = 65: must be 1 to 64"),
        ("receipt-window = 32", "receipt-window = 32: must be 1 to 31"),
        (
            "receipt-window = 4\nreceipt-suspect = 5",
            "receipt-suspect = 5: more than --receipt-window (4) could never make a pod suspect",
        ),
        ("ttl = 0", "ttl = 0: must be at least 1 second"),
        ("sweep-interval = \"0s\"", "sweep-interval/sweep-budget = 0: must be positive"),
        ("sweep-budget = 0", "sweep-interval/sweep-budget = 0: must be positive"),
        ("max-connections = 0", "max-connections/max-streams = 0: must be at least 1"),
        ("max-streams = 0", "max-connections/max-streams = 0: must be at least 1"),
        ("idle-timeout = \"500ms\"", "idle-timeout = 500ms: must be at least 1s"),
        ("read-timeout = \"50ms\"", "read-timeout = 50ms: must be at least 100ms"),
        ("write-timeout = \"50ms\"", "write-timeout = 50ms: must be at least 100ms"),
        ("connection-window = 1000", "connection-window = 1000: must be at least 65536"),
        ("bootstrap-queue = 0", "bootstrap-queue/bootstrap-timeout/snapshot-send-timeout = 0: must be positive"),
        ("bootstrap-timeout = \"0s\"", "bootstrap-queue/bootstrap-timeout/snapshot-send-timeout = 0: must be positive"),
        ("snapshot-send-timeout = \"0s\"", "bootstrap-queue/bootstrap-timeout/snapshot-send-timeout = 0: must be positive"),
        ("bootstrap-retry = \"0s\"", "bootstrap-retry/peer-connect-timeout = 0s: must be positive"),
        ("peer-connect-timeout = \"0s\"", "bootstrap-retry/peer-connect-timeout = 0s: must be positive"),
        ("snapshot-piece-bytes = 100", "snapshot-piece-bytes = 100: must be 4096 to 67108864"),
        ("snapshot-pieces = 1025", "snapshot-pieces = 1025: must be 1 to 1024"),
        ("tail-queue = 0", "tail-queue/repair-interval = 0: must be positive"),
        ("repair-interval = \"0s\"", "tail-queue/repair-interval = 0: must be positive"),
        ("tail-window = \"500ms\"", "tail-window = 500ms: must be at least 1s"),
        ("repair-budget = 16777217", "repair-budget = 16777217: must be 0 to 16777216"),
        ("max-snapshot-bytes = 1000", "max-snapshot-bytes = 1000: must be at least 1048576"),
        ("peers = [\"nowhere\"]", "peer = nowhere: not host:port"),
        ("token-block = 0", "token-block/max-held-batches/max-engines/max-engine-replays = 0: must be at least 1"),
        ("max-engines = 0", "token-block/max-held-batches/max-engines/max-engine-replays = 0: must be at least 1"),
        ("engine-threads = 65", "engine-threads = 65: must be 1 to 64"),
        ("replay-timeout = \"0s\"", "replay-timeout = 0s: must be positive"),
        ("engine-poll = \"11s\"", "engine-poll = 11s: must be 1ms to 10s"),
        ("max-held-bytes = 2048", "max-held-bytes = 2048: must be at least max-event-bytes"),
        ("max-event-tokens = 0", "max-batch-events/max-event-hashes/max-event-tokens = 0: must be at least 1"),
        ("max-event-bytes = 1000", "max-event-bytes = 1000: must be at least 1024"),
        ("max-queued-events = 0", "max-queued-events = 0: must be 1 to 2147483647"),
        ("engine-dns-interval = \"10ms\"", "engine-dns-interval = 10ms: must be 100ms to 1h"),
        ("engine-listen = \"udp://x\"", "engine-listen = udp://x: not tcp://host:port or \"off\""),
        ("metrics-listen = \"x\"", "metrics-listen = x: not an address (host:port) or \"off\""),
        ("readers = [\"cn:r\"]", "reader/writer/peer-identity = set: roles name client certificates: they need --client-ca (mutual TLS)"),
    ] {
        let settings = Settings::from_toml(text, Path::new("t.toml")).unwrap();
        assert_eq!(settings.resolve().unwrap_err().to_string(), message, "{text}");
    }
}

/// The variable that tells this test's children which layers to give.
const LAYERS: &str = "CONFIG_TESTS_LAYERS";

/// The configuration a layer is named for: `a`, every setting changed;
/// `p`, the same with plain HTTP; `d`, the defaults; `-`, none.
fn layer_config(of: &str) -> Option<ServerConfig> {
    Some(match of {
        "a" => everything_changed(),
        "p" => ServerConfig {
            transport: TransportConfig {
                http_plaintext: true,
                client_ca: None,
                ..everything_changed().transport
            },
            roles: Roles::default(),
            ..everything_changed()
        },
        "d" => ServerConfig::default(),
        _ => return None,
    })
}

/// The settings of layer `of` that have a value, as written.
fn layer(of: &str) -> Vec<(String, String)> {
    let all = layer_config(of).map(|cfg| Settings::describe(&cfg));
    let all = all.unwrap_or_default().into_iter();
    all.filter(|(_, value)| value != "none").collect()
}

/// Flag over environment over file over default, for every setting at once:
/// each of the three layers gives every setting the value of one
/// configuration (or none), and the configuration resolved takes each from
/// the highest layer that gives it. clap reads the environment itself, so
/// each case runs in a child process of this test, given its variables.
#[test]
fn flags_override_environment_override_file_override_defaults() {
    use clap::{Args as _, FromArgMatches as _};
    let cmd = Settings::augment(Settings::augment_args(clap::Command::new("t")));
    let arg = |key: &str| {
        let id = key.replace('-', "_");
        cmd.get_arguments()
            .find(|a| a.get_id() == id.as_str())
            .unwrap()
    };
    if let Ok(case) = std::env::var(LAYERS) {
        // In the child: `case` names the flags', the environment's (already
        // set) and the file's layer.
        let [flags, _, file]: [&str; 3] = case.split(',').collect::<Vec<_>>().try_into().unwrap();
        let mut argv = vec!["t".to_string()];
        for (key, value) in layer(flags) {
            argv.extend([format!("--{}", arg(&key).get_long().unwrap()), value]);
        }
        let matches = cmd.clone().try_get_matches_from(argv).unwrap();
        let flags_and_env = Settings::from_arg_matches(&matches).unwrap();
        let text = layer_config(file).map(|c| toml::to_string(&Settings::from(&c)).unwrap());
        let file = Settings::from_toml(&text.unwrap_or_default(), Path::new("t.toml")).unwrap();
        let cfg = flags_and_env.or(file).resolve().unwrap();
        let mut layers: Vec<_> = case.split(',').map(layer).collect();
        layers.push(layer("d"));
        for (key, value) in Settings::describe(&cfg) {
            let given = layers
                .iter()
                .find_map(|l| l.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()));
            assert_eq!(value, given.unwrap_or("none".into()), "{key} in {case}");
        }
        return;
    }
    let test = "config::tests::flags_override_environment_override_file_override_defaults";
    for of in ["a", "p"] {
        let cases = [
            format!("-,-,{of}"),
            format!("-,{of},d"),
            format!("-,d,{of}"),
            format!("{of},d,-"),
            format!("d,{of},-"),
            format!("{of},d,d"),
        ];
        for case in cases {
            let env_layer = case.split(',').nth(1).unwrap_or("-");
            let mut child = std::process::Command::new(std::env::current_exe().unwrap());
            child
                .args([test, "--exact", "--nocapture"])
                .env(LAYERS, &case);
            for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("PREFIX_INDEX_")) {
                child.env_remove(key);
            }
            for (key, value) in layer(env_layer) {
                child.env(arg(&key).get_env().unwrap(), value);
            }
            let out = child.output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && said.contains("1 passed"),
                "{case}: {said}"
            );
        }
    }
}
