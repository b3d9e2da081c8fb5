use serde_json::{json, Value};

use super::*;

use crate::message::PodBlocks;

fn full(kind: OpKind) -> JsonOp {
    let key = KeySource {
        text: Some("t".into()),
        tokens: Some(vec![1]),
        hashes: Some(vec![2]),
        identity: TokenIdentity {
            cache_salt: Some("s".into()),
            mm_items: Some(vec!["i:0:1".parse().unwrap()]),
            prompt_embeds: Some(vec!["00".into()]),
        },
    };
    // The fields several ops share, set once: only the arm of `kind` takes
    // them.
    let model: String = "m".into();
    let candidates = Some(vec!["a".into()]);
    // The three lookups take the same fields.
    macro_rules! lookup {
        ($variant:ident) => {
            JsonOp::$variant {
                model,
                key,
                candidates,
            }
        };
    }
    match kind {
        OpKind::Lookup => lookup!(Lookup),
        OpKind::Insert => JsonOp::Insert {
            model,
            key,
            pod: "p".into(),
        },
        OpKind::RemovePod => JsonOp::RemovePod { pod: "p".into() },
        OpKind::SetPodCapacity => JsonOp::SetPodCapacity {
            pod: "p".into(),
            blocks: 1,
        },
        OpKind::Stats => JsonOp::Stats,
        OpKind::Ping => JsonOp::Ping,
        OpKind::Subscribe => JsonOp::Subscribe {
            // Every field set: the defaults' block size and media with a
            // replay endpoint and a topic.
            engine: Subscription {
                replay: Some("tcp://h:2".into()),
                topic: "kv".into(),
                ..Subscription::new("p", "m", "tcp://h:1")
            },
        },
        OpKind::Unsubscribe => JsonOp::Unsubscribe { pod: "p".into() },
        OpKind::ListEngines => JsonOp::ListEngines,
        OpKind::SampleKeys => JsonOp::SampleKeys { count: 3, seed: 9 },
        OpKind::Tail => JsonOp::Tail {
            from: Some(4),
            max: 5,
        },
        OpKind::LookupDetail => lookup!(LookupDetail),
        OpKind::LookupTiers => lookup!(LookupTiers),
        OpKind::Digest => JsonOp::Digest {
            ask: crate::message::DigestAsk {
                level: crate::message::DigestLevel::Items,
                model,
                low: 1,
                high: 2,
                of: vec![3],
            },
        },
        OpKind::Receipt => JsonOp::Receipt {
            model,
            key,
            pod: "p".into(),
            predicted_blocks: 1,
            cached_tokens: 16,
            prompt_tokens: Some(20),
        },
    }
}

#[test]
fn the_field_table_is_what_serde_writes() {
    for kind in OpKind::ALL {
        let op = full(kind);
        assert_eq!(op.kind(), kind);
        let Value::Object(obj) = serde_json::to_value(&op).unwrap() else {
            panic!()
        };
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want: Vec<&str> = fields(kind).iter().copied().chain(["op"]).collect();
        want.sort_unstable();
        assert_eq!(keys, want, "{kind:?}");
        // Errors list the fields in the order serde writes them, the
        // op's own.
        let text = serde_json::to_string(&op).unwrap();
        let at: Vec<Option<usize>> = fields(kind)
            .iter()
            .map(|f| text.find(&format!("\"{f}\":")))
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{kind:?}: {:?} against {text}",
            fields(kind)
        );
        assert_eq!(obj["op"], kind.name());
        assert_eq!(kind_named(kind.name()), Some(kind));
    }
}

#[test]
fn ops_parse_with_and_without_their_tag() {
    let l = JsonOp::parse(br#"{"op":"insert","model":"m","text":"abc","pod":"p"}"#).unwrap();
    assert_eq!(
        l,
        JsonOp::Insert {
            model: "m".into(),
            key: KeySource {
                text: Some("abc".into()),
                ..KeySource::default()
            },
            pod: "p".into()
        }
    );
    let body = br#"{"model":"m","hashes":[18446744073709551615],"candidates":["a"]}"#;
    let op = JsonOp::parse_as(OpKind::Lookup, body).unwrap();
    assert_eq!(
        op.to_op(&KeyOptions::default()).unwrap(),
        Op::Lookup {
            model: "m".into(),
            key: vec![u64::MAX],
            candidates: Some(vec!["a".into()])
        }
    );
    assert_eq!(
        JsonOp::parse_as(OpKind::Stats, b"{}").unwrap(),
        JsonOp::Stats
    );
}

#[test]
fn token_ids_read_apart_give_the_op_serde_json_gives() {
    let lookup = |tokens: Option<Vec<u32>>| JsonOp::Lookup {
        model: "m".into(),
        key: KeySource {
            tokens,
            ..KeySource::default()
        },
        candidates: None,
    };
    // Read by `json::ids` (compact, and as Python's `json.dumps` writes it).
    for body in [
        r#"{"tokens":[7,0,4294967295],"model":"m"}"#,
        r#"{"model": "m", "tokens": [7, 0, 4294967295]}"#,
    ] {
        assert_eq!(
            JsonOp::parse_as(OpKind::Lookup, body.as_bytes()).unwrap(),
            lookup(Some(vec![7, 0, u32::MAX])),
            "{body}"
        );
    }
    // Left to serde_json whole: `null` is no key given, a sign an error.
    let null = JsonOp::parse_as(OpKind::Lookup, br#"{"tokens":null,"model":"m","text":"a"}"#);
    assert!(matches!(null, Ok(JsonOp::Lookup { key, .. }) if key.tokens.is_none()));
    let signed = JsonOp::parse_as(OpKind::Lookup, br#"{"tokens":[-1],"model":"m"}"#);
    assert!(signed
        .unwrap_err()
        .to_string()
        .contains("invalid value: integer `-1`"));
}

#[test]
fn bad_objects_are_refused_with_the_reason() {
    let cases: [(&[u8], &str); 12] = [
        (br#"{"op":"drop_table"}"#, "unknown op \"drop_table\""),
        (br#"{"op":"remove_pod"}"#, "remove_pod: missing field `pod`"),
        (
            br#"{"op":7}"#,
            "invalid type: integer `7`, expected a string",
        ),
        (br#"{"pod":"p"}"#, "missing field \"op\""),
        (br#"[1,2]"#, "expected a JSON object of an op's fields"),
        (br#"{"op":"ping","x":1}"#, "unknown field `x`"),
        (
            br#"{"op":"ping","pod":"p"}"#,
            "unknown field \"pod\" for ping; its fields are none",
        ),
        (br#"{"op":"ping","op":"ping"}"#, "duplicate field `op`"),
        (
            br#"{"op":"lookup","model":"m","hashes":[1],"pods":["a"]}"#,
            "unknown field `pods`",
        ),
        (
            br#"{"op":"lookup","model":"m","hashes":[-1]}"#,
            "invalid value: integer `-1`",
        ),
        (
            br#"{"op":"set_pod_capacity","pod":"p","blocks":"9"}"#,
            "invalid type: string",
        ),
        (br#"{"op":"ping""#, "bad JSON"),
    ];
    for (bytes, want) in cases {
        let e = JsonOp::parse(bytes).unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(bytes));
    }
    let e = JsonOp::parse_as(OpKind::Ping, br#"{"op":"ping"}"#).unwrap_err();
    assert!(
        e.to_string().contains("the path names the operation"),
        "{e}"
    );
    let both = KeySource {
        text: Some("x".into()),
        tokens: Some(vec![1]),
        ..KeySource::default()
    };
    assert!(both.key(&KeyOptions::default()).is_err());
    assert!(KeySource::default().key(&KeyOptions::default()).is_err());
}

#[test]
fn keys_follow_the_block_sizes() {
    let opts = KeyOptions {
        block_bytes: 4,
        block_tokens: 2,
    };
    let text = KeySource {
        text: Some("abcdefghi".into()),
        ..KeySource::default()
    };
    assert_eq!(text.key(&opts).unwrap().len(), 2);
    let tokens = KeySource {
        tokens: Some(vec![1, 2, 3, 4, 5]),
        ..KeySource::default()
    };
    assert_eq!(tokens.key(&opts).unwrap(), key::token_key(&[1, 2, 3, 4], 2));
}

/// A token key's identity from JSON fields is the key rule's, and goes
/// only with token ids.
#[test]
fn token_keys_take_their_identity_from_the_fields() {
    let opts = KeyOptions::default();
    let tokens: Vec<u32> = (0..64).collect();
    let body = |extra: &str| {
        format!(
            r#"{{"op":"lookup","model":"m","tokens":{}{extra}}}"#,
            serde_json::to_string(&tokens).unwrap()
        )
    };
    let key = |extra: &str| match JsonOp::parse(body(extra).as_bytes()).unwrap() {
        JsonOp::Lookup { key, .. } => key.key(&opts),
        other => panic!("{other:?}"),
    };
    let identity = key::Identity {
        cache_salt: Some("tenant".into()),
        mm_items: vec!["img:20:30".parse().unwrap()],
        prompt_embeds: None,
    };
    assert_eq!(
        key(r#","cache_salt":"tenant","mm_items":[{"identifier":"img","offset":20,"length":30}]"#)
            .unwrap(),
        key::token_key_with(&tokens, 16, &identity)
    );
    assert_ne!(key(r#","cache_salt":"tenant""#).unwrap(), key("").unwrap());
    let digests = key(r#","prompt_embeds":["0a0b","0c0d"]"#).unwrap();
    assert_eq!(digests.len(), 2);
    for (extra, why) in [
        (r#","prompt_embeds":["abc"]"#, "prompt_embeds[0]"),
        (r#","prompt_embeds":["zz"]"#, "prompt_embeds[0]"),
    ] {
        let e = key(extra).unwrap_err().to_string();
        assert!(e.contains(why), "{extra}: {e}");
    }
    let e =
        JsonOp::parse(br#"{"op":"lookup","model":"m","mm_items":[{"identifier":"x","offset":1}]}"#)
            .unwrap_err()
            .to_string();
    assert!(e.contains("length"), "{e}");
    let text = KeySource {
        text: Some("x".repeat(64)),
        identity: TokenIdentity {
            cache_salt: Some("s".into()),
            ..TokenIdentity::default()
        },
        ..KeySource::default()
    };
    let e = text.key(&opts).unwrap_err().to_string();
    assert!(e.contains("go with \"tokens\""), "{e}");
    let hashes = KeySource {
        hashes: Some(vec![1]),
        ..text
    };
    assert!(hashes.clone().into_key(&opts).is_err());
}

#[test]
fn batches_are_bounded_before_their_ops_are_read() {
    let opts = KeyOptions::default();
    let req = parse_batch(
        br#"{"ops":[{"op":"ping"},{"op":"remove_pod","pod":"p"}]}"#,
        &opts,
        2,
    )
    .unwrap();
    assert_eq!(
        req,
        Request::Batch(vec![Op::Ping, Op::RemovePod { pod: "p".into() }])
    );
    let code = |r: Result<Request, Reply>| match r {
        Err(Reply::Error { code, message }) => (ErrorCode::from_u16(code), message),
        other => panic!("{other:?}"),
    };
    let (c, _) = code(parse_batch(br#"{"ops":[1,2,3]}"#, &opts, 2));
    assert_eq!(c, Some(ErrorCode::BatchTooLarge));
    let (c, m) = code(parse_batch(
        br#"{"ops":[{"op":"ping"},{"op":"nope"}]}"#,
        &opts,
        2,
    ));
    assert_eq!(c, Some(ErrorCode::Malformed));
    assert!(m.starts_with("ops[1]: unknown op"), "{m}");
    let (c, _) = code(parse_batch(br#"{"ops":{}}"#, &opts, 2));
    assert_eq!(c, Some(ErrorCode::Malformed));
    let (c, _) = code(parse_batch(br#"{"ops":[],"x":1}"#, &opts, 2));
    assert_eq!(c, Some(ErrorCode::Malformed));
}

#[test]
fn replies_become_objects() {
    let lookup = Reply::Lookup {
        key_blocks: 3,
        matches: vec![PodBlocks {
            pod: "a".into(),
            blocks: 2,
        }],
    };
    assert_eq!(
        reply_json(&lookup),
        json!({"ok":true,"key_blocks":3,"matches":[{"pod":"a","blocks":2}]})
    );
    assert_eq!(
        reply_json(&ErrorCode::KeyTooLong.reply("too long")),
        json!({"ok":false,"error":{"code":5,"name":"key_too_long","message":"too long"}})
    );
    assert_eq!(
        error_json(Some(999), "new"),
        json!({"ok":false,"error":{"code":999,"name":null,"message":"new"}})
    );
    assert_eq!(
        reply_json(&Reply::Removed(true)),
        json!({"ok":true,"removed":true})
    );
}

#[test]
fn the_writer_writes_what_reply_json_gives() {
    let lookup = Reply::Lookup {
        key_blocks: 3,
        matches: vec![
            PodBlocks {
                pod: "a\"b".into(),
                blocks: 2,
            },
            PodBlocks {
                pod: "c".into(),
                blocks: 1,
            },
        ],
    };
    let err = ErrorCode::BadName.reply("no");
    let mut out = b"junk".to_vec();
    let mut w = JsonWriter::one(&mut out);
    w.lookup(3, &[("a\"b", 2), ("c", 1)]);
    assert_eq!(w.finish(), None);
    let v: Value = serde_json::from_slice(&out[4..]).unwrap();
    assert_eq!(v, reply_json(&lookup));

    let mut out = Vec::new();
    let mut w = JsonWriter::batch(&mut out);
    w.lookup(3, &[("a\"b", 2), ("c", 1)]);
    w.reply(&err);
    w.reply(&Reply::Pong);
    assert_eq!(w.finish(), None);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v,
        json!({"ok":true,"results":[reply_json(&lookup), reply_json(&err), {"ok":true}]})
    );

    let mut out = Vec::new();
    let mut w = JsonWriter::one(&mut out);
    w.reply(&err);
    assert_eq!(w.finish(), Some(ErrorCode::BadName as u16));
    let mut out = b"x".to_vec();
    let mut w = JsonWriter::batch(&mut out);
    w.reply(&err);
    assert!(w.len() > 10);
    w.abandon();
    assert_eq!(out, b"x");
}

/// What a JSON client meets, per operation, held to the copy in
/// `tests/data/json_surface.txt`: its fields, an op as serde writes it, and
/// the answer (the op read, or the error's text) to its whole object, to an
/// empty one, to each field alone, and to a field of another op and one
/// of none beside the rest.
/// A restructure leaves the copy byte-for-byte the same; a change on
/// purpose rewrites it with `PREFIX_SURFACE_WRITE=1 cargo test -p
/// prefix-proto --lib json_surface` and says what changed in `CHANGELOG.md`.
#[test]
fn the_json_surface_is_as_kept() {
    let answer = |r: Result<JsonOp, JsonError>| match r {
        Ok(op) => format!("ok {}", serde_json::to_string(&op).unwrap()),
        Err(e) => format!("error {e}"),
    };
    let mut text = String::new();
    for kind in OpKind::ALL {
        let op = full(kind);
        let whole = serde_json::to_string(&op).unwrap();
        let Value::Object(mut obj) = serde_json::to_value(&op).unwrap() else {
            panic!("{kind:?} is not an object")
        };
        obj.remove("op");
        text += &format!("{}: {}\n", kind.name(), fields(kind).join(", "));
        text += &format!("  written: {whole}\n");
        text += &format!("  whole: {}\n", answer(JsonOp::parse(whole.as_bytes())));
        text += &format!("  empty: {}\n", answer(JsonOp::parse_as(kind, b"{}")));
        for (field, value) in &obj {
            let alone = json!({ field: value }).to_string();
            let got = answer(JsonOp::parse_as(kind, alone.as_bytes()));
            text += &format!("  {field} alone: {got}\n");
        }
        // A field of another op, then one of none.
        let (other, value) = match fields(kind).contains(&"pod") {
            true => ("count", json!(1)),
            false => ("pod", json!("p")),
        };
        let mut with = obj.clone();
        with.insert(other.into(), value);
        let got = answer(JsonOp::parse_as(
            kind,
            Value::Object(with).to_string().as_bytes(),
        ));
        text += &format!("  with {other}: {got}\n");
        obj.insert("zzz".into(), json!(1));
        let unknown = Value::Object(obj).to_string();
        let got = answer(JsonOp::parse_as(kind, unknown.as_bytes()));
        text += &format!("  with zzz: {got}\n");
    }
    for body in [
        r#"{"op":"x"}"#,
        r#"{"zzz":1}"#,
        "[]",
        r#"{"op":"ping","op":"ping"}"#,
    ] {
        text += &format!("{body}: {}\n", answer(JsonOp::parse(body.as_bytes())));
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/json_surface.txt");
    if std::env::var_os("PREFIX_SURFACE_WRITE").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (write it with PREFIX_SURFACE_WRITE=1)",
            path.display()
        )
    });
    for (n, (k, t)) in kept.lines().zip(text.lines()).enumerate() {
        assert_eq!(k, t, "{} line {}", path.display(), n + 1);
    }
    assert_eq!(
        kept.lines().count(),
        text.lines().count(),
        "{}",
        path.display()
    );
}
