"""SGLang's KV indexer contract, run against a real prefix-server.

The client is generated from server/proto/kv_indexer.proto by grpcio-tools
(check.sh); nothing here is written from our reading of the server. What it
checks:

- the proto's descriptor is the one of SGLang's own kv_indexer.proto at
  commit 360d10d6 (sgl-project/sglang, experimental/sgl-router/
  sgl-kv-indexer/proto), by the SHA-256 of its serialized FileDescriptorProto
  (source info left out), taken once from that file with the same pinned
  grpcio-tools;
- the scenarios of SGLang's contract tests (sgl-kv-indexer/tests/
  grpc_contract.rs at that commit), each named after its test, with their
  requests and assertions; `prefix_limit_rejects_over_real_grpc_without_
  blocking_writes` needs a backend that holds queries and is not run, and
  `router_client_publishes_its_deadline_on_the_wire` tests the router's
  client, not the server;
- the router's block hashes (its compute_block_hashes, re-implemented here)
  against the router's own golden values, then a pod this server follows
  through SGLang-style ZMQ events matched by those hashes.

Usage: check.py HOST:PORT DESCRIPTOR_SET
"""

import hashlib
import json
import struct
import sys
import time
import urllib.request

import grpc
import msgpack
import zmq
from google.protobuf import descriptor_pb2

import kv_indexer_pb2 as pb
import kv_indexer_pb2_grpc as rpc

UPSTREAM_DESCRIPTOR_SHA256 = "5d77dde3f3ad2f9c64aca362c9a305257d42cd75086d094838957e96e7903cfd"

addr, descriptor_set = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def descriptor_matches_upstream():
    s = descriptor_pb2.FileDescriptorSet()
    with open(descriptor_set, "rb") as f:
        s.ParseFromString(f.read())
    d = s.file[0]
    d.ClearField("source_code_info")
    d.name = "kv_indexer.proto"
    digest = hashlib.sha256(d.SerializeToString(deterministic=True)).hexdigest()
    check(digest == UPSTREAM_DESCRIPTOR_SHA256, f"descriptor digest {digest}")


channel = grpc.insecure_channel(
    addr,
    options=[("grpc.max_send_message_length", 16 << 20), ("grpc.max_receive_message_length", 16 << 20)],
)
client = rpc.KVIndexerStub(channel)
nanos = time.time_ns()


def action(kind, tier, hashes):
    return pb.ExternalKvAction(type=kind, tier=tier, hashes=hashes)


def apply(worker, address, seq, actions):
    return client.ApplyExternalKvBatch(
        pb.ApplyExternalKvBatchRequest(worker_id=worker, seq=seq, actions=actions, worker_address=address),
        timeout=10,
    )


def code_of(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def multiple_workers_share_one_indexer_server():
    w0, w1 = f"worker-0-{nanos}", f"worker-1-{nanos}"
    h0, h1, shared = 101, 102, 103
    apply(w0, "10.0.0.1:9000", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, [h0, shared])])
    apply(w1, "10.0.0.2:9000", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, [h1, shared])])
    r = client.MatchExternalKv(pb.MatchExternalKvRequest(hashes=[h0, h1, shared], count_as_hit=False))
    ids = {m.worker_id for m in r.matches}
    check(w0 in ids and w1 in ids, f"both workers match: {ids}")
    client.MatchExternalKv(pb.MatchExternalKvRequest(hashes=[h0], count_as_hit=True))
    counts = client.GetExternalKvHitCounts(pb.GetExternalKvHitCountsRequest(hashes=[h0, 104]))
    by_hash = {e.hash: e.hit_count_total for e in counts.entries}
    check(by_hash.get(h0, 0) >= 1, f"a counted hit: {by_hash}")
    check(by_hash.get(104, 0) == 0, f"no hit on an unknown hash: {by_hash}")


def validation_errors_map_to_invalid_argument_over_grpc():
    check(
        code_of(lambda: apply("", "addr", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, [1])]))
        == grpc.StatusCode.INVALID_ARGUMENT,
        "an empty worker_id is INVALID_ARGUMENT",
    )
    odd = pb.ExternalKvAction(type=999, tier=pb.TIER_HBM, hashes=[1])
    check(
        code_of(lambda: apply("w", "", 1, [odd])) == grpc.StatusCode.INVALID_ARGUMENT,
        "an unknown action is INVALID_ARGUMENT",
    )


def match_prefix_over_grpc():
    long_w, short_w = f"long-{nanos}", f"short-{nanos}"
    a, b, d = 201, 202, 203
    apply(long_w, "10.0.0.1:9000", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, [a, b, d])])
    apply(short_w, "10.0.0.2:9000", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, [a])])
    r = client.MatchExternalKvPrefix(pb.MatchExternalKvPrefixRequest(hashes=[a, b, d], max_blocks=0))
    check(r.best_prefix_blocks == 3, f"best_prefix_blocks {r.best_prefix_blocks}")
    check(r.blocks_read == 3, f"blocks_read {r.blocks_read}")
    check(len(r.matches) == 2, f"two matches: {r.matches}")
    if len(r.matches) == 2:
        check(r.matches[0].worker_id == long_w and r.matches[0].matched_prefix_blocks == 3, "the long worker first")
        check(r.matches[0].worker_address == "10.0.0.1:9000", "its address")
        check(r.matches[1].worker_id == short_w and r.matches[1].matched_prefix_blocks == 1, "then the short one")


def prefix_query_scans_more_than_one_apply_chunk_over_grpc():
    hashes = list(range(1_000_000, 1_000_000 + 16_385))
    worker = f"large-prefix-worker-{nanos}"
    apply(worker, "10.0.0.1:9000", 0, [action(pb.ACTION_REPORT, pb.TIER_HBM, hashes[:16_384])])
    apply(worker, "10.0.0.1:9000", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, hashes[16_384:])])
    r = client.MatchExternalKvPrefix(pb.MatchExternalKvPrefixRequest(hashes=hashes, max_blocks=0))
    check(r.best_prefix_blocks == 16_385, f"best {r.best_prefix_blocks}")
    check(r.blocks_read == 16_385, f"read {r.blocks_read}")


def packed_signed_hash_query_can_exceed_tonics_default_receive_limit():
    apply(f"large-wire-worker-{nanos}", "10.0.0.1:9000", 1, [action(pb.ACTION_REPORT, pb.TIER_HBM, [-1])])
    hashes = [-1] + list(range(1, 600_000))
    r = client.MatchExternalKvPrefix(pb.MatchExternalKvPrefixRequest(hashes=hashes, max_blocks=0))
    check(r.best_prefix_blocks == 1, f"a 4.8 MB query: best {r.best_prefix_blocks}")


def query_past_the_configured_limit_is_refused_as_out_of_range():
    hashes = list(range(0, 8 * 1024 * 1024 // 8 + 1024))
    code = code_of(lambda: client.MatchExternalKvPrefix(pb.MatchExternalKvPrefixRequest(hashes=hashes)))
    check(code == grpc.StatusCode.OUT_OF_RANGE, f"a query past 8 MiB: {code}")


def router_hashes(tokens, block):
    """The router's compute_block_hashes (src/policies/kv_events/hash.rs)."""
    out, prev = [], None
    for i in range(0, len(tokens), block):
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        for t in tokens[i : i + block]:
            h.update(struct.pack("<I", t))
        prev = h.digest()
        out.append(struct.unpack(">q", prev[:8])[0])
    return out


def router_hashes_match_the_routers_goldens():
    check(router_hashes([1, 2, 3, 4], 4) == [-3488128144981237669], "golden 1")
    check(router_hashes([1, 2, 3, 4, 5], 4) == [-3488128144981237669, -3787494577174227566], "golden 2")
    check(
        router_hashes([10, 20, 30, 40, 50, 60, 70, 80], 2)
        == [978178666101069530, -895308556211281782, -8033692805846017938, 835415944263129316],
        "golden 3",
    )
    check(
        router_hashes([7, 8, 9], 1) == [-1702009526849766914, 903318264012984157, -8265893088400908305],
        "kv_events_hash_parity block_size_one",
    )


def a_bridge_reports_the_routers_hashes():
    # What the router asks for a prompt, as a bridge reported its worker's
    # cache: a 70-token prompt whose first four 16-token pages are cached.
    tokens = list(range(300, 370))
    asked = router_hashes(tokens, 16)
    apply(f"bridge-{nanos}", "http://127.0.0.1:30002", 7, [action(pb.ACTION_REPORT, pb.TIER_HBM, asked[:4])])
    r = client.MatchExternalKvPrefix(pb.MatchExternalKvPrefixRequest(hashes=asked, max_blocks=0))
    routed = {m.worker_address: m.matched_prefix_blocks for m in r.matches}
    check(routed.get("http://127.0.0.1:30002") == 4, f"the bridged worker: {routed}")


def a_followed_sglang_engine_answers_the_routers_hashes():
    # An SGLang engine's events (its msgpack BlockStored, one page a store,
    # chained by parent), followed by this server with --block-aliases
    # engine: the router's hashes of the prompt match it with no bridge.
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    body = json.dumps(
        {"pod": "http://127.0.0.1:30001", "model": "m", "endpoint": f"tcp://127.0.0.1:{port}", "block_size": 16}
    ).encode()
    req = urllib.request.Request(f"http://{addr}/v1/subscribe", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        check(json.load(resp).get("ok") is True, "subscribed")
    pub.poll(10_000)
    pub.recv()
    tokens = list(range(100, 164))
    hashes = router_hashes(tokens, 16)
    events = []
    for i, h in enumerate(hashes):
        parent = hashes[i - 1] if i else None
        events.append(["BlockStored", [h], parent, tokens[i * 16 : (i + 1) * 16], 16, None, "GPU"])
    pub.send_multipart([b"", struct.pack(">Q", 0), msgpack.packb([time.time(), events, 0])])
    asked = router_hashes(list(range(100, 170)), 16)
    routed = {}
    for _ in range(250):
        r = client.MatchExternalKvPrefix(pb.MatchExternalKvPrefixRequest(hashes=asked, max_blocks=0))
        routed = {m.worker_address: m.matched_prefix_blocks for m in r.matches}
        if routed.get("http://127.0.0.1:30001") == 4:
            break
        time.sleep(0.02)
    check(routed.get("http://127.0.0.1:30001") == 4, f"the followed engine: {routed}")
    pub.close()
    ctx.term()


for scenario in [
    descriptor_matches_upstream,
    multiple_workers_share_one_indexer_server,
    validation_errors_map_to_invalid_argument_over_grpc,
    match_prefix_over_grpc,
    prefix_query_scans_more_than_one_apply_chunk_over_grpc,
    packed_signed_hash_query_can_exceed_tonics_default_receive_limit,
    query_past_the_configured_limit_is_refused_as_out_of_range,
    router_hashes_match_the_routers_goldens,
    a_bridge_reports_the_routers_hashes,
    a_followed_sglang_engine_answers_the_routers_hashes,
]:
    before = len(failures)
    scenario()
    print("ok  " if len(failures) == before else "FAIL", scenario.__name__)

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("the SGLang indexer contract holds")
