#!/usr/bin/env python3
"""Generate golden block-identity test data from vLLM's own Python functions.

The Rust tests use the files written here to prove that our block-identity
rule (per-block extra keys, chained SHA-256/CBOR block hashes, and the
``BlockStored`` KV event wire format) agrees with vLLM 0.33.0.

vLLM cannot be imported without torch, so this script does not import the
``vllm`` package.  Instead it reads vLLM's source files from an unzipped
wheel (or the ``.whl`` file itself), parses them with :mod:`ast`, picks the
function / class / constant definitions it needs by name, and compiles and
executes exactly those nodes in a namespace prepared with small stubs
(``envs``, ``logger``, ``tensor_data``, ``Request`` ...).  No vLLM code is
copied into this file; every rule that matters runs as vLLM wrote it:

* ``vllm/v1/core/kv_cache_utils.py``: ``generate_block_hash_extra_keys`` and
  its helpers, ``to_event_extra_keys``, ``hash_block_tokens``,
  ``init_none_hash``, ``maybe_convert_block_hash``,
  ``get_request_block_hasher`` (used to cross-check our per-block loop);
* ``vllm/utils/hashing.py``: ``sha256_cbor``;
* ``vllm/multimodal/utils.py``: ``get_mm_features_in_window``;
* ``vllm/lora/request.py``: ``LoRARequest``;
* ``vllm/distributed/kv_events.py``: ``EventBatch``, ``KVCacheEvent``,
  ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``, ``KVEventBatch``,
  encoded with ``msgspec.msgpack.Encoder()`` as ``ZmqEventPublisher`` does.

Outputs (paths relative to the repository root):

* ``client/proto/testdata/vllm_extra_keys.json`` -- per-block extra keys
  (tagged hash keys and untagged event keys) for a set of requests;
* ``server/tests/data/vllm_identity/<scenario>.msgpack`` -- one ZeroMQ
  payload (a ``KVEventBatch`` with one ``BlockStored``) per scenario;
* ``server/tests/data/vllm_identity/cases.json`` -- the inputs and expected
  block hashes of those payloads.

Usage::

    pip install msgspec cbor2
    python3 gen_vllm_identity.py /path/to/unzipped/wheel [REPO_ROOT]

``/path/to/unzipped/wheel`` is the directory that contains ``vllm/`` (or the
``vllm-0.33.0-*.whl`` file).  ``REPO_ROOT`` defaults to three directories
above this script.  The output is deterministic: PYTHONHASHSEED is forced to
``0`` before vLLM's ``init_none_hash`` runs.
"""

import ast
import hashlib
import json
import os
import sys
import types
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NewType, TypeAlias

import msgspec

VLLM_VERSION = "0.33.0"
PLACEHOLDER_TOKEN = 151655
NUM_TOKENS = 160
BLOCK_SIZE = 16


# ---------------------------------------------------------------------------
# Loading vLLM definitions with ast
# ---------------------------------------------------------------------------


class WheelSource:
    """Reads files of the vllm package from an unzipped wheel or a .whl."""

    def __init__(self, location: str):
        self.location = Path(location)
        self.zip = zipfile.ZipFile(self.location) if self.location.is_file() else None

    def read(self, rel: str) -> str:
        if self.zip is not None:
            return self.zip.read(rel).decode("utf-8")
        return (self.location / rel).read_text(encoding="utf-8")


def _node_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def load_definitions(src: WheelSource, rel: str, names: list[str], ns: dict) -> None:
    """Exec the top-level definitions ``names`` of vLLM file ``rel`` into ``ns``.

    Nodes are executed in file order, so a class can use one defined above it.
    A bare annotation (``NONE_HASH: BlockHash``) counts as found but binds
    nothing, exactly as at import time.
    """
    tree = ast.parse(src.read(rel), filename=rel)
    wanted = set(names)
    picked = [n for n in tree.body if wanted & set(_node_names(n))]
    found = {name for n in picked for name in _node_names(n)}
    missing = wanted - found
    if missing:
        raise SystemExit(f"{rel}: definitions not found: {sorted(missing)}")
    module = ast.Module(body=picked, type_ignores=[])
    exec(compile(module, f"<vllm>/{rel}", "exec"), ns)


def new_module(name: str) -> dict:
    """A real module registered in sys.modules (msgspec resolves struct
    annotations through the defining module)."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    return mod.__dict__


class _Logger:
    def warning(self, *args, **kwargs):
        pass

    info = debug = warning


@dataclass
class FakeEmbeds:
    """Stand-in for a prompt-embeddings tensor: row i is i as 8 LE bytes."""

    rows: list[bytes]

    def __getitem__(self, item):
        assert isinstance(item, slice)
        return FakeEmbeds(self.rows[item])

    def __len__(self):
        return len(self.rows)


def fake_tensor_data(tensor: FakeEmbeds) -> bytes:
    # vLLM's tensor_data returns the raw bytes of the (flattened) tensor.
    return b"".join(tensor.rows)


def load_vllm(src: WheelSource) -> types.SimpleNamespace:
    # vllm/utils/hashing.py
    hashing = new_module("vllm_ast.hashing")
    hashing.update(hashlib=hashlib, Any=Any, Callable=Callable, _xxhash=None)
    exec("import cbor2, pickle", hashing)
    load_definitions(
        src,
        "vllm/utils/hashing.py",
        ["sha256", "sha256_cbor", "_xxhash_digest", "xxhash", "xxhash_cbor"],
        hashing,
    )

    # vllm/multimodal/utils.py
    mm_utils = new_module("vllm_ast.mm_utils")

    class MultiModalFeatureSpec:  # annotation-only stub
        pass

    exec("import bisect", mm_utils)
    mm_utils.update(MultiModalFeatureSpec=MultiModalFeatureSpec, Sequence=Sequence)
    load_definitions(
        src, "vllm/multimodal/utils.py", ["get_mm_features_in_window"], mm_utils
    )

    # vllm/multimodal/inputs.py (PlaceholderRange, MultiModalFeatureSpec)
    mm_inputs = new_module("vllm_ast.mm_inputs")
    mm_inputs.update(
        dataclass=dataclass, field=field, cached_property=cached_property, Any=Any
    )
    load_definitions(
        src,
        "vllm/multimodal/inputs.py",
        ["PlaceholderRange", "MultiModalFeatureSpec"],
        mm_inputs,
    )

    # vllm/lora/request.py
    lora = new_module("vllm_ast.lora_request")
    lora.update(msgspec=msgspec)
    load_definitions(src, "vllm/lora/request.py", ["LoRARequest"], lora)

    # vllm/v1/core/kv_cache_utils.py
    kcu = new_module("vllm_ast.kv_cache_utils")

    class Request:  # annotation-only stub; FakeRequest below is duck-typed
        pass

    kcu.update(
        hashlib=hashlib,
        os=os,
        Any=Any,
        Callable=Callable,
        Iterable=Iterable,
        Sequence=Sequence,
        NewType=NewType,
        TypeAlias=TypeAlias,
        Request=Request,
        envs=types.SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=True),
        logger=_Logger(),
        xxhash=hashing["xxhash"],
        xxhash_cbor=hashing["xxhash_cbor"],
        tensor_data=fake_tensor_data,
        get_mm_features_in_window=mm_utils["get_mm_features_in_window"],
    )
    load_definitions(
        src,
        "vllm/v1/core/kv_cache_utils.py",
        [
            "BlockHash",
            "ExternalBlockHash",
            "maybe_convert_block_hash",
            "NONE_HASH",
            "DEFAULT_NONE_HASH_SEED",
            "_NON_CRYPTO_HASH_FUNCTIONS",
            "_NONE_HASH_SEED",
            "resolve_none_hash_seed",
            "init_none_hash",
            "_gen_mm_extra_hash_keys",
            "_gen_lora_extra_hash_keys",
            "_gen_prompt_embeds_extra_hash_keys",
            "generate_block_hash_extra_keys",
            "to_event_extra_keys",
            "hash_block_tokens",
            "get_request_block_hasher",
        ],
        kcu,
    )

    # vllm/distributed/kv_events.py
    kve = new_module("vllm_ast.kv_events")
    kve.update(
        msgspec=msgspec, Any=Any, ExternalBlockHash=kcu["ExternalBlockHash"]
    )
    load_definitions(
        src,
        "vllm/distributed/kv_events.py",
        [
            "EventBatch",
            "KVCacheEvent",
            "MEDIUM_GPU",
            "BlockStored",
            "BlockRemoved",
            "AllBlocksCleared",
            "KVEventBatch",
        ],
        kve,
    )

    # NONE_HASH exactly as vLLM derives it, with PYTHONHASHSEED=0.
    os.environ["PYTHONHASHSEED"] = "0"
    kcu["init_none_hash"](hashing["sha256_cbor"])
    assert kcu["_NONE_HASH_SEED"] == "0"

    return types.SimpleNamespace(
        hashing=hashing, kcu=kcu, kve=kve, lora=lora, mm_inputs=mm_inputs
    )


# ---------------------------------------------------------------------------
# A duck-typed vllm.v1.request.Request
# ---------------------------------------------------------------------------


class FakeRequest:
    """The attributes of vllm.v1.request.Request that the hashing code reads."""

    def __init__(self, vllm, tokens, mm_items, cache_salt, lora, prompt_embeds):
        PlaceholderRange = vllm.mm_inputs["PlaceholderRange"]
        MultiModalFeatureSpec = vllm.mm_inputs["MultiModalFeatureSpec"]
        LoRARequest = vllm.lora["LoRARequest"]
        self.all_token_ids = list(tokens)
        self.num_tokens = len(tokens)
        self.block_hashes = []
        self.cache_salt = cache_salt
        self.mm_features = [
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=item["identifier"],
                mm_position=PlaceholderRange(
                    offset=item["offset"], length=item["length"]
                ),
            )
            for item in mm_items
        ]
        self.lora_request = (
            LoRARequest(
                lora_name=lora["name"],
                lora_int_id=lora.get("id", 1),
                lora_path=lora["path"],
            )
            if lora
            else None
        )
        self.prompt_embeds = prompt_embeds
        self._prompt_embeds_per_block_hashes = {}
        self.session_id = None


def block_walk(vllm, request, block_size):
    """Per-block extra keys and hashes for all full blocks from token 0,
    threading the mm index as get_request_block_hasher does (no lookahead).
    The hashes are cross-checked against vLLM's own get_request_block_hasher.
    """
    kcu = vllm.kcu
    hash_fn = vllm.hashing["sha256_cbor"]
    keys, hashes = [], []
    curr_mm_idx = 0
    parent = None
    start = 0
    while start + block_size <= request.num_tokens:
        end = start + block_size
        extra, curr_mm_idx = kcu["generate_block_hash_extra_keys"](
            request, start, end, curr_mm_idx
        )
        h = kcu["hash_block_tokens"](
            hash_fn, parent, request.all_token_ids[start:end], extra
        )
        keys.append(extra)
        hashes.append(h)
        parent = h
        start = end

    hasher = kcu["get_request_block_hasher"](block_size, hash_fn)
    assert request.block_hashes == []
    assert hasher(request) == hashes, "per-block loop disagrees with vLLM's hasher"
    return keys, hashes


# ---------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------


def to_json(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    raise TypeError(f"unexpected {type(value)!r} in extra keys")


def base_tokens(n=NUM_TOKENS):
    return [(i * 7919) % 50000 + 100 for i in range(n)]


def image_tokens(mm_items, n=NUM_TOKENS):
    t = base_tokens(n)
    for item in mm_items:
        for i in range(item["offset"], item["offset"] + item["length"]):
            t[i] = PLACEHOLDER_TOKEN
    return t


def _dump(obj, indent: int = 0) -> str:
    """JSON with objects indented, scalar lists and short lists on one line."""
    flat = json.dumps(obj)
    scalars = isinstance(obj, list) and all(
        not isinstance(v, (list, dict)) for v in obj
    )
    if not isinstance(obj, (list, dict)) or scalars or len(flat) <= 88:
        return flat
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {_dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _dump(v, indent + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def write_json(path: Path, obj) -> None:
    text = _dump(obj) + "\n"
    assert json.loads(text) == obj
    path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------
# 1. client/proto/testdata/vllm_extra_keys.json
# ---------------------------------------------------------------------------

SALT = "tenant-a"
SQL_LORA = {"name": "sql-lora", "path": "/adapters/sql"}


def mm(identifier, offset, length):
    return {"identifier": identifier, "offset": offset, "length": length}


EXTRA_KEY_CASES = [
    dict(name="plain"),
    dict(name="salted", cache_salt=SALT),
    dict(name="image_across_blocks", mm_items=[mm("img-a", 32, 64)]),
    dict(
        name="two_items_one_block",
        mm_items=[mm("img-a", 18, 4), mm("img-b", 24, 6)],
    ),
    dict(
        name="items_on_block_boundaries",
        mm_items=[mm("img-a", 48, 16), mm("img-b", 70, 26)],
    ),
    dict(name="item_mid_block_three_blocks", mm_items=[mm("img-a", 5, 40)]),
    dict(name="image_salted", cache_salt=SALT, mm_items=[mm("img-a", 32, 64)]),
    dict(name="lora_salted", cache_salt=SALT, lora=SQL_LORA),
    dict(name="lora", lora=SQL_LORA),
    dict(name="prompt_embeds", prompt_embeds=True),
    dict(name="prompt_embeds_salted", cache_salt=SALT, prompt_embeds=True),
    dict(name="block32_image", block_size=32, mm_items=[mm("img-a", 40, 50)]),
    dict(name="short_tail", num_tokens=157, mm_items=[mm("img-a", 32, 64)]),
    dict(
        name="second_item_starts_in_block_first_ends",
        mm_items=[mm("img-a", 10, 20), mm("img-b", 30, 20)],
    ),
]


def gen_extra_keys(vllm) -> dict:
    kcu = vllm.kcu
    cases = []
    for spec in EXTRA_KEY_CASES:
        block_size = spec.get("block_size", BLOCK_SIZE)
        num_tokens = spec.get("num_tokens", NUM_TOKENS)
        mm_items = sorted(spec.get("mm_items", []), key=lambda m: m["offset"])
        cache_salt = spec.get("cache_salt")
        lora = spec.get("lora")
        embeds = None
        if spec.get("prompt_embeds"):
            embeds = FakeEmbeds([i.to_bytes(8, "little") for i in range(num_tokens)])
        req = FakeRequest(
            vllm, image_tokens(mm_items, num_tokens), mm_items, cache_salt, lora, embeds
        )
        keys, _hashes = block_walk(vllm, req, block_size)
        event_keys = kcu["to_event_extra_keys"](keys)
        digests = None
        if embeds is not None:
            digests = [
                req._prompt_embeds_per_block_hashes[(b * block_size, (b + 1) * block_size)].hex()
                for b in range(len(keys))
            ]
        cases.append(
            {
                "name": spec["name"],
                "block_size": block_size,
                "num_tokens": num_tokens,
                "cache_salt": cache_salt,
                "lora": dict(lora) if lora else None,
                "mm_items": mm_items,
                "prompt_embeds_digests": digests,
                "hash_keys": to_json(keys),
                "event_keys": to_json(event_keys),
            }
        )
    return {
        "source": (
            f"vLLM {VLLM_VERSION} wheel: vllm/v1/core/kv_cache_utils.py "
            "generate_block_hash_extra_keys and to_event_extra_keys"
        ),
        "cases": cases,
    }


# ---------------------------------------------------------------------------
# 2. server/tests/data/vllm_identity/
# ---------------------------------------------------------------------------

IMAGE_A = [mm("img-a", 32, 64)]
SQL_LORA_1 = dict(SQL_LORA, id=1)

EVENT_SCENARIOS = [
    dict(name="plain"),
    dict(name="salted", cache_salt=SALT),
    dict(name="image_a", mm_items=IMAGE_A),
    dict(name="lora", lora=SQL_LORA_1),
    dict(name="lora_salted", cache_salt=SALT, lora=SQL_LORA_1),
]


def build_batch(vllm, req, block_size):
    """The KVEventBatch vLLM publishes after caching all full blocks of
    ``req`` in one step (BlockPool.cache_full_blocks with num_cached_blocks=0,
    then KVCacheManager.take_events annotating the spec kind)."""
    kcu, kve = vllm.kcu, vllm.kve
    keys, hashes = block_walk(vllm, req, block_size)
    num_full = len(hashes)
    lr = req.lora_request
    event = kve["BlockStored"](
        block_hashes=[kcu["maybe_convert_block_hash"](h) for h in hashes],
        parent_block_hash=None,
        token_ids=req.all_token_ids[0 : num_full * block_size],
        block_size=block_size,
        lora_id=lr.adapter_id if lr else None,
        medium=kve["MEDIUM_GPU"],
        lora_name=lr.name if lr else None,
        extra_keys=kcu["to_event_extra_keys"](keys),
        group_idx=0,
        session_id=req.session_id,
        lookahead_token_ids=None,
    )
    event.kv_cache_spec_kind = "full_attention"  # KVCacheSpecKind.FULL_ATTENTION
    event.kv_cache_spec_sliding_window = None
    batch = kve["KVEventBatch"](ts=1.0, events=[event])
    batch.data_parallel_rank = 0  # what EventPublisher.publish fills in
    return batch, keys, hashes


def gen_events(vllm, out_dir: Path) -> list:
    kve = vllm.kve
    encoder = msgspec.msgpack.Encoder()  # as ZmqEventPublisher._publisher_thread
    decoder = msgspec.msgpack.Decoder(kve["KVEventBatch"])
    cases = []
    for sc in EVENT_SCENARIOS:
        mm_items = sc.get("mm_items", [])
        tokens = image_tokens(mm_items)
        lora = sc.get("lora")
        req = FakeRequest(vllm, tokens, mm_items, sc.get("cache_salt"), lora, None)
        batch, keys, hashes = build_batch(vllm, req, BLOCK_SIZE)
        payload = encoder.encode(batch)
        (out_dir / f"{sc['name']}.msgpack").write_bytes(payload)

        # Round trip through vLLM's own struct definitions.
        # Nested (mm_identifier, offset) tuples are typed Any, so they decode
        # as lists: compare through the JSON form.
        back = decoder.decode(payload)
        plain = lambda b: msgspec.json.decode(msgspec.json.encode(b))  # noqa: E731
        assert plain(back) == plain(batch), sc["name"]
        ev = back.events[0]
        assert to_json(ev.extra_keys) == to_json(batch.events[0].extra_keys)
        assert type(ev) is kve["BlockStored"]
        assert back.ts == 1.0 and back.data_parallel_rank == 0
        assert ev.token_ids == tokens and ev.block_size == BLOCK_SIZE
        assert ev.parent_block_hash is None and ev.medium == "GPU"
        assert ev.group_idx == 0 and ev.kv_cache_spec_kind == "full_attention"
        assert ev.block_hashes == [int.from_bytes(h[-8:], "big") for h in hashes]

        cases.append(
            {
                "name": sc["name"],
                "file": f"{sc['name']}.msgpack",
                "tokens": tokens,
                "cache_salt": sc.get("cache_salt"),
                "mm_items": mm_items,
                "lora_name": lora["name"] if lora else None,
                "lora_path": lora["path"] if lora else None,
                "lora_id": lora["id"] if lora else None,
                "block_hashes": list(ev.block_hashes),
                "block_digests": [h.hex() for h in hashes],
                "event_extra_keys": to_json(ev.extra_keys),
            }
        )
    return cases


# The hybrid scenario: a model with a full-attention group (0) and a
# sliding-window group (1, a window of 32 tokens, as gpt-oss and Gemma 3
# have), each caching the plain request's 10 blocks in one step; then the
# window group's pool evicts blocks 8 and 9.
HYBRID_WINDOW = 32
HYBRID_GROUPS = [(0, "full_attention", None), (1, "sliding_window", HYBRID_WINDOW)]
HYBRID_EVICTED = [8, 9]


def gen_hybrid(vllm, out_dir: Path) -> dict:
    """``hybrid_stored.msgpack``: one batch with a ``BlockStored`` per group,
    annotated as ``KVCacheManager.take_events`` annotates them;
    ``hybrid_evicted.msgpack``: one batch with a ``BlockRemoved`` per block
    the window group evicted, as ``BlockPool`` sends them (one hash each,
    the group's index)."""
    kcu, kve = vllm.kcu, vllm.kve
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(kve["KVEventBatch"])
    req = FakeRequest(vllm, base_tokens(), [], None, None, None)
    _, hashes = block_walk(vllm, req, BLOCK_SIZE)
    ints = [kcu["maybe_convert_block_hash"](h) for h in hashes]
    stored = []
    for idx, kind, window in HYBRID_GROUPS:
        event = kve["BlockStored"](
            block_hashes=ints,
            parent_block_hash=None,
            token_ids=req.all_token_ids[0 : len(hashes) * BLOCK_SIZE],
            block_size=BLOCK_SIZE,
            lora_id=None,
            medium=kve["MEDIUM_GPU"],
            lora_name=None,
            extra_keys=None,
            group_idx=idx,
            session_id=None,
            lookahead_token_ids=None,
        )
        event.kv_cache_spec_kind = kind
        event.kv_cache_spec_sliding_window = window
        stored.append(event)
    removed = [
        kve["BlockRemoved"](block_hashes=[ints[i]], medium=kve["MEDIUM_GPU"], group_idx=1)
        for i in HYBRID_EVICTED
    ]
    files = {}
    for name, events in (("hybrid_stored", stored), ("hybrid_evicted", removed)):
        batch = kve["KVEventBatch"](ts=1.0, events=events)
        batch.data_parallel_rank = 0
        payload = encoder.encode(batch)
        back = decoder.decode(payload)
        plain = lambda b: msgspec.json.decode(msgspec.json.encode(b))  # noqa: E731
        assert plain(back) == plain(batch), name
        (out_dir / f"{name}.msgpack").write_bytes(payload)
        files[name] = f"{name}.msgpack"
    return {
        "stored": files["hybrid_stored"],
        "evicted": files["hybrid_evicted"],
        "tokens": req.all_token_ids,
        "groups": [
            {"group_idx": i, "kind": k, "sliding_window": w} for i, k, w in HYBRID_GROUPS
        ],
        "evicted_blocks": HYBRID_EVICTED,
        "block_hashes": ints,
    }


README = """\
# vLLM block-identity fixtures

Generated from vLLM {version}'s own Python functions (read from the wheel with
`ast`, not imported) by `client/proto/testdata/gen_vllm_identity.py`:

    python3 client/proto/testdata/gen_vllm_identity.py /path/to/unzipped/wheel

Each `<name>.msgpack` is one ZeroMQ payload frame exactly as
`ZmqEventPublisher` sends it: `msgspec.msgpack.Encoder().encode(batch)` of a
`KVEventBatch(ts=1.0, events=[BlockStored], data_parallel_rank=0)`.
The `BlockStored` covers all 160 tokens in 10 blocks of 16:
`block_hashes` are `hash_block_tokens` with `sha256_cbor`, NONE_HASH from
`init_none_hash` with PYTHONHASHSEED=0, converted to ints (last 8 digest bytes,
big-endian; `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`); `parent_block_hash` nil,
`medium` "GPU", `group_idx` 0, `kv_cache_spec_kind` "full_attention",
`extra_keys` = `to_event_extra_keys(...)` of the per-block hash keys.

Wire form (msgspec {msgspec_version}): the batch is an array
`[ts (float64), [event], data_parallel_rank]` (`array_like=True`); the event is a
map (msgspec writes a map16 header even for 11 entries) whose first entry is the
tag `"type": "BlockStored"`, then the fields in declaration order. Fields still at
their default (`kv_cache_spec_sliding_window`, `locality`, `ownership`,
`session_id`, `lookahead_token_ids`) are omitted; required fields that are None
(`parent_block_hash`, `lora_id`, `lora_name`) are written as nil. Hashes are
msgpack uint64. Event extra keys: per block nil or an array of the LoRA name, then
`[mm_identifier, offset]` pairs (offset relative to the block start, negative when
the item began in an earlier block), then the cache salt (first block only).

Tokens: `t[i] = (i * 7919) % 50000 + 100`, i in 0..160; in image scenarios
positions offset..offset+length-1 hold the placeholder id 151655. Blocks 0 and 1
of `image_a` therefore hash the same as in `plain`.

| file | cache_salt | mm_items | LoRA (name, path, lora_id) |
|---|---|---|---|
| plain.msgpack | - | - | - |
| salted.msgpack | tenant-a | - | - |
| image_a.msgpack | - | img-a, offset 32, length 64 | - |
| lora.msgpack | - | - | sql-lora, /adapters/sql, 1 |
| lora_salted.msgpack | tenant-a | - | sql-lora, /adapters/sql, 1 |

A hybrid model: `hybrid_stored.msgpack` is one batch of two `BlockStored`
events for the `plain` request's 10 blocks, one per KV-cache group: group 0
`full_attention`, group 1 `sliding_window` with
`kv_cache_spec_sliding_window` 32 (fields set as
`KVCacheManager.take_events` sets them). `hybrid_evicted.msgpack` is one
batch of two `BlockRemoved` events, blocks 8 and 9, `group_idx` 1: the
window group evicted them, the full-attention group keeps them. vLLM's
coordinator then reuses 8 blocks (the window needs blocks 6 and 7 before
a hit at 8, and has nothing after 7). `cases.json` describes them under
`hybrid`.

`cases.json` lists per file: name, file, tokens, cache_salt, mm_items,
lora_name, lora_path, lora_id, block_hashes (the u64 ints in the event),
block_digests (full 32-byte SHA-256 digests, hex) and event_extra_keys.
Note: the LoRA path is part of the block hash key `("lora", name, path)` but
is not published in the event (event extra keys carry only the name).
"""


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    src = WheelSource(argv[1])
    repo = Path(argv[2]) if len(argv) == 3 else Path(__file__).resolve().parents[3]
    testdata = repo / "client" / "proto" / "testdata"
    events_dir = repo / "server" / "tests" / "data" / "vllm_identity"
    testdata.mkdir(parents=True, exist_ok=True)
    events_dir.mkdir(parents=True, exist_ok=True)

    vllm = load_vllm(src)
    write_json(testdata / "vllm_extra_keys.json", gen_extra_keys(vllm))
    cases = gen_events(vllm, events_dir)
    hybrid = gen_hybrid(vllm, events_dir)
    write_json(
        events_dir / "cases.json",
        {
            "source": f"vLLM {VLLM_VERSION} wheel, see README.md",
            "none_hash_seed": "0",
            "block_size": BLOCK_SIZE,
            "cases": cases,
            "hybrid": hybrid,
        },
    )
    (events_dir / "README.md").write_text(README.format(
            version=VLLM_VERSION, msgspec_version=msgspec.__version__
        ))
    print(f"wrote {testdata / 'vllm_extra_keys.json'}")
    print(f"wrote {events_dir}/{{cases.json,README.md,*.msgpack}}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
