"""Runs the client that openapi-python-client generated from docs/openapi.json
against a real prefix-server (check.sh starts both): every route once, a batch
of every kind of answer, and errors. Each answer must have a status its route
documents, validate against the description's schema for that status, and
decode into the generated model with the values the server was given.

Usage: check.py BASE_URL CA_PEM OPENAPI_JSON. The server runs with
--max-key-blocks 8 and --max-batch 16, so that refusals stay small."""

import json
import sys
from functools import reduce
from operator import xor

import httpx
from openapi_schema_validator import OAS31Validator
from prefix_index_api import Client
from prefix_index_api.api.default import (
    batch,
    digest,
    healthz,
    insert,
    list_engines,
    lookup,
    lookup_detail,
    lookup_tiers,
    ping,
    readyz,
    receipt,
    remove_pod,
    sample_keys,
    set_pod_capacity,
    stats,
    subscribe,
    tail,
    unsubscribe,
)
from prefix_index_api.models import (
    BatchAnswer,
    BatchRequest,
    DetailAnswer,
    DetailMatchView,
    DigestAnswer,
    DigestRequest,
    DigestRequestLevel,
    EnginesAnswer,
    Error,
    InsertRequest,
    KeysAnswer,
    LookupAnswer,
    LookupRequest,
    Ok,
    Op,
    OpOp,
    ReceiptRequest,
    RemovedAnswer,
    RemovePodRequest,
    SampleKeysRequest,
    SetPodCapacityRequest,
    StatsAnswer,
    SubscribeRequest,
    TailRequest,
    TiersAnswer,
    UnsubscribeRequest,
    WritesAnswer,
)
from prefix_index_api.models import ErrorErrorNameType1 as ErrorName
from referencing import Registry
from referencing.jsonschema import DRAFT202012

BASE, CA, SPEC = sys.argv[1:4]
with open(SPEC) as f:
    DOC = json.load(f)
# Each generated module is named by its operation's operationId.
ROUTES = {
    op["operationId"]: (path, method)
    for path, methods in DOC["paths"].items()
    for method, op in methods.items()
}
REGISTRY = Registry().with_resource("openapi.json", DRAFT202012.create_resource(DOC))

# Hashes from the top of the range: a client that rounds them through a
# double, or holds them in an int64, changes them.
HASHES = [2**64 - 1, 2**63, 2**53 + 1]
TOKENS = list(range(1, 17))
MAX_KEY_BLOCKS = 8
MAX_BATCH = 16


def deref(node):
    """`node`, or what its `$ref` (within the description) points at."""
    while "$ref" in node:
        ref, node = node["$ref"], DOC
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
    return node


def validate(path, method, status, body):
    """Checks `body` against the schema the description gives the answer of
    `method` `path` with `status`, which it must document."""
    responses = DOC["paths"][path][method]["responses"]
    if str(status) not in responses:
        raise AssertionError(f"{method} {path} answered {status}, which it does not document")
    schema = deref(responses[str(status)])["content"]["application/json"]["schema"]
    ref = "openapi.json" + schema["$ref"]
    validator = OAS31Validator(
        {"$ref": ref}, registry=REGISTRY, format_checker=OAS31Validator.FORMAT_CHECKER
    )
    errors = sorted(validator.iter_errors(body), key=str)
    if errors:
        raise AssertionError(
            f"{method} {path} {status}: {body}\n  "
            + "\n  ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
        )


def call(api, status, model, **kwargs):
    """Calls the generated `api` and returns its decoded answer, after
    checking its status, its schema and its model."""
    path, method = ROUTES[api.__name__.rsplit(".", 1)[1]]
    response = api.sync_detailed(client=CLIENT, **kwargs)
    body = json.loads(response.content)
    assert response.status_code == status, f"{method} {path}: {response.status_code} {body}"
    validate(path, method, status, body)
    assert isinstance(response.parsed, model), f"{method} {path}: {response.parsed!r}"
    return response.parsed


def error_name(answer):
    return (answer.error.code, answer.error.name)


CLIENT = Client(base_url=BASE, verify_ssl=CA, raise_on_unexpected_status=True, timeout=10)

call(ping, 200, Ok)

# The tail keeps writes from its first ask on.
start = call(tail, 200, WritesAnswer, body=TailRequest(max_=16))
assert start.ops == [] and start.from_ == start.next_, start

# Nulls where the server takes them: optional fields, read as absent.
call(
    insert,
    200,
    Ok,
    body=InsertRequest(model="llama", hashes=HASHES, pod="pod-a", text=None, tokens=None),
)
call(insert, 200, Ok, body=InsertRequest(model="qwen", tokens=TOKENS, pod="pod-b", cache_salt=None))
call(set_pod_capacity, 200, Ok, body=SetPodCapacityRequest(pod="pod-a", blocks=1000))

key = HASHES + [7]
found = call(
    lookup,
    200,
    LookupAnswer,
    body=LookupRequest(model="llama", hashes=key, candidates=["pod-a", "pod-z"]),
)
assert found.key_blocks == 4, found
assert [(m.pod, m.blocks) for m in found.matches] == [("pod-a", 3)], found
found = call(
    lookup,
    200,
    LookupAnswer,
    body=LookupRequest(model="qwen", tokens=TOKENS + [99], candidates=None),
)
assert [(m.pod, m.blocks) for m in found.matches] == [("pod-b", 1)], found

detail = call(lookup_detail, 200, DetailAnswer, body=LookupRequest(model="llama", hashes=key))
assert [(m.pod, m.blocks, m.lower_blocks, m.view) for m in detail.matches] == [
    ("pod-a", 3, 0, DetailMatchView.GATEWAY)
], detail
# No receipt yet: every count 0.
assert [m.receipts.to_dict() for m in detail.matches] == [dict(exact=0, over=0, under=0)], detail

# Receipts: the engine reused what the lookup predicted. With tokens the
# server counts the prompt: 16 tokens end on a block's end, so the engine
# could reuse none of the one block predicted, and reusing none is exact.
call(
    receipt,
    200,
    Ok,
    body=ReceiptRequest(
        model="llama",
        hashes=key,
        pod="pod-a",
        predicted_blocks=3,
        cached_tokens=48,
        prompt_tokens=None,
    ),
)
call(
    receipt,
    200,
    Ok,
    body=ReceiptRequest(
        model="qwen", tokens=TOKENS, pod="pod-b", predicted_blocks=1, cached_tokens=0
    ),
)
detail = call(lookup_detail, 200, DetailAnswer, body=LookupRequest(model="llama", hashes=key))
assert [(m.pod, m.view, m.receipts.to_dict()) for m in detail.matches] == [
    ("pod-a", DetailMatchView.GATEWAY, dict(exact=1, over=0, under=0))
], detail

tiered = call(lookup_tiers, 200, TiersAnswer, body=LookupRequest(model="llama", hashes=key))
assert [(m.pod, m.blocks, m.tiers) for m in tiered.matches] == [("pod-a", 3, [])], tiered

counts = call(stats, 200, StatsAnswer)
assert (counts.models, counts.pods, counts.entries) == (2, 2, 4), counts

sampled = call(sample_keys, 200, KeysAnswer, body=SampleKeysRequest(count=8, seed=None))
assert 1 <= len(sampled.keys) <= 8, sampled
for k in sampled.keys:
    assert k.model in ("llama", "qwen"), k
    # The only llama key, every hash intact.
    assert k.model != "llama" or k.hashes == HASHES, k

writes = call(tail, 200, WritesAnswer, body=TailRequest(from_=start.next_, max_=16))
assert [w.op for w in writes.ops] == [OpOp.INSERT, OpOp.INSERT, OpOp.SET_POD_CAPACITY], writes
assert writes.ops[0]["hashes"] == HASHES and writes.ops[0]["pod"] == "pod-a", writes
assert writes.next_ == start.next_ + 3, writes

# Digests, level by level, down to llama's entries: pod-a's key.
# Digests and item hashes take the whole u64 range, as hashes do.
WINDOW = {"low": 0, "high": 2**62}
models = call(
    digest, 200, DigestAnswer, body=DigestRequest(level=DigestRequestLevel.MODELS, **WINDOW)
).models
assert [(m.model, len(m.groups)) for m in models] == [("llama", 64), ("qwen", 64)], models
cells = call(
    digest,
    200,
    DigestAnswer,
    body=DigestRequest(level=DigestRequestLevel.CELLS, model="llama", of=list(range(64)), **WINDOW),
).values
assert len(cells) == 4096, len(cells)
for g, group in enumerate(models[0].groups):
    assert reduce(xor, cells[64 * g : 64 * (g + 1)], 0) == group, g
held = [c for c, d in enumerate(cells) if d != 0]
items = call(
    digest,
    200,
    DigestAnswer,
    body=DigestRequest(level=DigestRequestLevel.ITEMS, model="llama", of=held, **WINDOW),
)
assert len(items.values) == len(HASHES) and not items.more, items
assert reduce(xor, items.values, 0) == reduce(xor, models[0].groups, 0), items
found = call(
    digest,
    200,
    DigestAnswer,
    body=DigestRequest(level=DigestRequestLevel.ENTRIES, model="llama", of=items.values, **WINDOW),
)
# One entry per tree node holding asked items, each key down to its node's
# deepest block: pod-a's whole key, and perhaps prefixes of it.
assert all(e.pod == "pod-a" and e.key == HASHES[: len(e.key)] for e in found.entries), found
assert HASHES in [e.key for e in found.entries] and not found.more, found

# An engine's subscription: its nulls (no replay, no event yet) and defaults.
call(
    subscribe,
    200,
    Ok,
    body=SubscribeRequest(pod="engine-1", model="llama", endpoint="tcp://127.0.0.1:9", replay=None),
)
(engine,) = call(list_engines, 200, EnginesAnswer).engines
assert engine.pod == "engine-1" and engine.block_size == 16 and engine.media == ["GPU"], engine
assert engine.replay is None and engine.last_seq is None, engine
gone = call(unsubscribe, 200, RemovedAnswer, body=UnsubscribeRequest(pod="engine-1"))
assert gone.removed is True, gone
gone = call(remove_pod, 200, RemovedAnswer, body=RemovePodRequest(pod="nobody"))
assert gone.removed is False, gone


def op(name, **fields):
    o = Op(op=OpOp(name))
    o.additional_properties.update(fields)
    return o


# A batch with every kind of answer, errors in their places.
ops = [
    (op("ping"), Ok),
    (op("lookup", model="llama", hashes=key), LookupAnswer),
    (op("lookup_detail", model="llama", hashes=key), DetailAnswer),
    (op("lookup_tiers", model="llama", hashes=key), TiersAnswer),
    (op("stats"), StatsAnswer),
    (op("sample_keys", count=2, seed=9), KeysAnswer),
    (op("list_engines"), EnginesAnswer),
    (op("remove_pod", pod="nobody"), RemovedAnswer),
    (op("tail", max=1), WritesAnswer),
    (op("digest", level="models", low=0, high=1), DigestAnswer),
    (
        op("receipt", model="llama", hashes=key, pod="pod-a", predicted_blocks=3, cached_tokens=48),
        Ok,
    ),
    (op("insert", model="llama", hashes=[1] * (MAX_KEY_BLOCKS + 1), pod="pod-a"), Error),
    (op("lookup", model="", text="x" * 64), Error),
]
answer = call(batch, 200, BatchAnswer, body=BatchRequest(ops=[o for o, _ in ops]))
assert len(answer.results) == len(ops), answer
for (o, model), result in zip(ops, answer.results):
    assert isinstance(result, model), (o, result)
assert error_name(answer.results[-2]) == (5, ErrorName.KEY_TOO_LONG), answer.results[-2]
assert error_name(answer.results[-1]) == (7, ErrorName.BAD_NAME), answer.results[-1]

# Refusals: each with its status, decoded as the Error model.
refused = call(
    lookup, 422, Error, body=LookupRequest(model="llama", hashes=[1] * (MAX_KEY_BLOCKS + 1))
)
assert error_name(refused) == (5, ErrorName.KEY_TOO_LONG), refused
refused = call(insert, 400, Error, body=InsertRequest(model="llama", hashes=[1], pod=""))
assert error_name(refused) == (7, ErrorName.BAD_NAME), refused
refused = call(lookup, 400, Error, body=LookupRequest(model="llama", hashes=[1], text="also"))
assert error_name(refused) == (1, ErrorName.MALFORMED), refused
refused = call(batch, 422, Error, body=BatchRequest(ops=[op("ping")] * (MAX_BATCH + 1)))
assert error_name(refused) == (6, ErrorName.BATCH_TOO_LARGE), refused
refused = call(
    receipt,
    422,
    Error,
    body=ReceiptRequest(
        model="llama", hashes=key, pod="nobody", predicted_blocks=1, cached_tokens=0
    ),
)
assert error_name(refused) == (18, ErrorName.BAD_RECEIPT), refused
refused = call(
    receipt,
    400,
    Error,
    body=ReceiptRequest(
        model="qwen",
        tokens=TOKENS,
        pod="pod-b",
        predicted_blocks=1,
        cached_tokens=0,
        prompt_tokens=17,
    ),
)
assert error_name(refused) == (1, ErrorName.MALFORMED), refused

# The probes: plain text, the same as on the metrics listener.
for probe, text in [(healthz, b"ok\n"), (readyz, b"ready\n")]:
    answer = probe.sync_detailed(client=CLIENT)
    assert (answer.status_code, answer.content) == (200, text), answer

# What the generated client never sends: another path, another method. The
# answers still have the documented shape, without a code; each is checked
# against the route a client that strayed meant to call.
with httpx.Client(base_url=BASE, verify=CA, timeout=10) as raw:
    for method, path, status, meant in [
        ("post", "/v1/no-such-route", 404, ("/v1/lookup", "post")),
        ("post", "/v1/ping", 405, ("/v1/ping", "get")),
        ("get", "/v1/lookup", 405, ("/v1/lookup", "post")),
    ]:
        r = raw.request(method, path, json={})
        assert r.status_code == status, (method, path, r.status_code, r.text)
        validate(*meant, status, r.json())
        assert error_name(Error.from_dict(r.json())) == (None, None), r.text

print("openapi check: every route answered as docs/openapi.json describes")
