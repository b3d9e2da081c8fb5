"""Lookups per second from one Python process with this package, against the
Rust client (prefix-load) on the same server and keys, alternating; then a
prompt of 1,000,000 tokens through `lookup_tokens` (hashed in Rust, one
lookup of 62,500 blocks that matches nothing), five times: the median.

    python bench.py [--rounds 3] [--duration 3]

Needs `cargo build --release` (prefix-server, prefix-load) and the package
installed. The keys are prefix-load's: 1,024 keys of 32 blocks, each held by
16 pods, so every answer names 16 pods.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from conftest import ROOT, Server  # noqa: E402

from prefix_index import Client  # noqa: E402

PODS, KEYS, BLOCKS = 16, 1024, 32
KEYSET = [[k << 20 | b for b in range(BLOCKS)] for k in range(KEYS)]


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def sync_cell(c, duration):
    lat, i = [], 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        s = time.perf_counter()
        r = c.lookup("m", KEYSET[i % KEYS])
        lat.append(time.perf_counter() - s)
        assert len(r.matches) == PODS
        i += 1
    return cell("python-sync", 1, lat, time.perf_counter() - t0, time.process_time() - cpu0)


def many_cell(c, duration, per_call):
    lat, n, i = [], 0, 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        keys = [KEYSET[(i + j) % KEYS] for j in range(per_call)]
        s = time.perf_counter()
        found = c.lookup_many("m", keys)
        lat.append(time.perf_counter() - s)
        assert all(len(r.matches) == PODS for r in found)
        n += per_call
        i += per_call
    row = cell(f"python-many{per_call}", 1, lat, time.perf_counter() - t0, time.process_time() - cpu0)
    row["lookups_per_s"] = n / (time.perf_counter() - t0)
    row["client_cpu_us"] *= len(lat) / n
    return row


def async_cell(c, duration, in_flight):
    lat = []

    async def worker(w):
        i = w * 7919
        while time.perf_counter() - t0 < duration:
            s = time.perf_counter()
            r = await c.lookup_async("m", KEYSET[i % KEYS])
            lat.append(time.perf_counter() - s)
            assert len(r.matches) == PODS
            i += 1

    async def main():
        await asyncio.gather(*(worker(w) for w in range(in_flight)))

    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(main())
    return cell("python-asyncio", in_flight, lat, time.perf_counter() - t0, time.process_time() - cpu0)


def giant_ms(c, times=5):
    tokens = [200_000 + i % 50_000 for i in range(1_000_000)]
    lat = []
    for _ in range(times):
        s = time.perf_counter()
        found = c.lookup_tokens("m", tokens)
        lat.append(time.perf_counter() - s)
        assert not found.matches
    return percentile(lat, 0.5) * 1e3, [t * 1e3 for t in lat]


def cell(name, in_flight, lat, seconds, cpu):
    return {
        "client": name,
        "in_flight": in_flight,
        "lookups_per_s": len(lat) / seconds,
        "p50_us": percentile(lat, 0.5) * 1e6,
        "p99_us": percentile(lat, 0.99) * 1e6,
        "client_cpu_us": cpu * 1e6 / len(lat),
    }


def rust_cells(server, duration):
    load = os.environ.get("PREFIX_LOAD", str(ROOT / "target/release/prefix-load"))
    out = subprocess.run(
        [load, "http", "--server", server.address, "--ca", server.ca, "--rounds", "1",
         "--duration", f"{duration}s", "--in-flight", "1,16", "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [
        {"client": "rust", "in_flight": c["in_flight"], "lookups_per_s": c["lookups_per_s"],
         "p50_us": c["p50_us"], "p99_us": c["p99_us"], "client_cpu_us": c["client_cpu_us"]}
        for c in json.loads(out)
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    args = ap.parse_args()
    server = Server("--pod-capacity", str(KEYS * BLOCKS))
    try:
        rows = rust_cells(server, args.duration)  # also fills the index
        c = Client(server.address, ca=server.ca, deadline=5.0)
        for r in range(args.rounds):
            order = [lambda: [sync_cell(c, args.duration), many_cell(c, args.duration, 16)],
                     lambda: [async_cell(c, args.duration, 16)],
                     lambda: rust_cells(server, args.duration)]
            for f in order[r % 3:] + order[:r % 3]:
                for row in f():
                    row["round"] = r
                    rows.append(row)
        giant = giant_ms(c)
    finally:
        server.close()
    rows = [r for r in rows if "round" in r]
    print(f"{'round':>5} {'client':>15} {'in':>4} {'lookups/s':>10} {'p50 µs':>8} {'p99 µs':>8} {'client µs/op':>13}")
    for r in rows:
        print(f"{r['round']:>5} {r['client']:>15} {r['in_flight']:>4} {r['lookups_per_s']:>10.0f} "
              f"{r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['client_cpu_us'] or 0:>13.1f}")
    print(f"lookup_tokens of 1,000,000 tokens: median {giant[0]:.1f} ms "
          f"({', '.join(f'{t:.1f}' for t in giant[1])})")


if __name__ == "__main__":
    main()
