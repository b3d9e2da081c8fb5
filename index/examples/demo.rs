//! Demo: replays the Mooncake conversation trace through an embedded index as
//! a gateway routing to 16 pods (cached share of the prompt weighed against
//! load), and prints the prefix hit ratio and the index's size.
//!
//! `cargo run --release -p prefix-index --example demo [TRACE]`

use std::io::BufRead;
use std::time::Instant;

use prefix_index::{Index, IndexConfig};

const PODS: usize = 16;

fn parse_hash_ids(line: &str) -> Option<(u64, Vec<u64>)> {
    // The trace is flat JSON with integer fields; a tiny scanner keeps the
    // index crate free of a JSON dependency.
    let ts = line
        .split("\"timestamp\":")
        .nth(1)?
        .split([',', '}'])
        .next()?
        .trim()
        .parse()
        .ok()?;
    let ids = line.split("\"hash_ids\":").nth(1)?;
    let ids = ids.split('[').nth(1)?.split(']').next()?;
    let key = ids
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    Some((ts, key))
}

fn main() -> std::io::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../shared/traces/mooncake_conversation.jsonl".into());
    let file = std::fs::File::open(&path)?;
    let index = Index::new(IndexConfig::default());
    let pods: Vec<String> = (0..PODS).map(|i| format!("pod-{i:02}")).collect();
    let mut load = [0u64; PODS];
    let (mut hit, mut total, mut requests) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let epoch = 1_700_000_000_000u64;
    for line in std::io::BufReader::new(file).lines() {
        let Some((ts, key)) = parse_hash_ids(&line?) else {
            continue;
        };
        let now = epoch + ts;
        let reader = index.reader();
        let found = reader.lookup("kimi", &key, None, now);
        // Score = share of the key cached − load above the least loaded pod,
        // in units of the mean load: a hot prefix cannot take every request.
        let mut matched = [0u32; PODS];
        for m in &found.matches {
            if let Some(i) = pods
                .iter()
                .position(|p| Some(p.as_str()) == reader.pod_name(m.pod))
            {
                matched[i] = m.blocks;
            }
        }
        let min = load.iter().copied().min().unwrap_or(0) as f64;
        let mean = load.iter().sum::<u64>() as f64 / PODS as f64 + 1.0;
        let score = |i: usize| {
            f64::from(matched[i]) / key.len().max(1) as f64 - (load[i] as f64 - min) / mean
        };
        let pick = (0..PODS)
            .max_by(|&a, &b| score(a).total_cmp(&score(b)))
            .unwrap_or(0);
        let best = matched[pick];
        drop(reader);
        load[pick] += 1;
        hit += u64::from(best);
        total += key.len() as u64;
        requests += 1;
        if let Err(e) = index.insert("kimi", &key, &pods[pick], now) {
            eprintln!("insert refused: {e}");
        }
        if requests % 1000 == 0 {
            index.sweep(now, 10_000);
        }
    }
    let s = index.stats();
    println!(
        "replayed {requests} requests from {path} in {:.2?}",
        start.elapsed()
    );
    println!(
        "prefix hit ratio: {:.3} of {total} blocks",
        hit as f64 / total.max(1) as f64
    );
    println!(
        "index: {} nodes, {} tree blocks, {} (pod, block) entries, {} bytes ({:.1} B/entry)",
        s.nodes,
        s.tree_blocks,
        s.entries,
        s.bytes,
        s.bytes as f64 / s.entries.max(1) as f64
    );
    println!("requests per pod: {load:?}");
    Ok(())
}
