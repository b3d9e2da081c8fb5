//! `prefix-client replay`: JSON Lines in, one JSON line out per line, in order.

use prefix_testkit::server as common;

use prefix_client::replay::replay;
use prefix_client::wire::json::KeyOptions;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_answers_every_line_in_order() {
    let server = common::start(|_| {}).await;
    let client = server.client().await;
    let text = "x".repeat(64 * 3 + 10);
    let input = format!(
        concat!(
            r#"{{"op":"insert","model":"m","text":"{t}","pod":"b"}}"#,
            "\n",
            r#"{{"op":"insert","model":"m","hashes":[{h0}],"pod":"a"}}"#,
            "\n",
            r#"{{"op":"lookup","model":"m","text":"{t}"}}"#,
            "\n",
            r#"{{"op":"lookup","model":"m","text":"{t}","candidates":["a"]}}"#,
            "\n",
            "this is not json\n",
            r#"{{"op":"insert","model":"m","tokens":[1,2,3],"pod":"c"}}"#,
            "\n",
            r#"{{"op":"set_pod_capacity","pod":"b","blocks":1}}"#,
            "\n",
            r#"{{"op":"remove_pod","pod":"a"}}"#,
            "\n",
            r#"{{"op":"insert","model":"m","text":"t","tokens":[1],"pod":"c"}}"#,
            "\n",
            r#"{{"op":"stats"}}"#,
            "\n",
            r#"{{"op":"launch"}}"#,
            "\n",
        ),
        t = text,
        h0 = prefix_client::key::text_key(&text, 64)[0],
    );
    let mut out = Vec::new();
    let counts = replay(&client, &KeyOptions::default(), input.as_bytes(), &mut out)
        .await
        .unwrap();
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 11);
    assert_eq!(counts.lines, 11);
    assert_eq!(counts.failed, 3);
    let ok = |i: usize| lines[i]["ok"] == Value::Bool(true);
    assert!(ok(0) && ok(1));
    assert_eq!(
        lines[2].to_string(),
        r#"{"ok":true,"key_blocks":3,"matches":[{"pod":"b","blocks":3},{"pod":"a","blocks":1}]}"#
    );
    assert_eq!(
        lines[3].to_string(),
        r#"{"ok":true,"key_blocks":3,"matches":[{"pod":"a","blocks":1}]}"#
    );
    assert!(
        !ok(4)
            && lines[4]["error"]["name"] == "malformed"
            && lines[4]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("JSON object")
    );
    // Three tokens make no full 16-token block: an empty key, a no-op.
    assert!(ok(5));
    assert!(ok(6));
    assert_eq!(lines[7].to_string(), r#"{"ok":true,"removed":true}"#);
    assert!(
        !ok(8)
            && lines[8]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("only one")
    );
    assert_eq!(lines[9]["pods"], 1);
    assert!(!ok(10));
    assert_eq!(lines[10]["error"]["name"], "malformed");
    server.shutdown().await;
}
