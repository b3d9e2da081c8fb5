"""Golden vectors for prefix-events: KV-event payloads as the engines encode them.

Each vector is a payload `NAME.msgpack`, encoded by msgspec (the encoder vLLM
and SGLang use) from struct definitions with the engines' own field names,
field order and struct options (`array_like`, `omit_defaults`, `tag`), and
`NAME.json`, the values `prefix_events::decode_batch` must return, computed
here from the Python values (not from the bytes). `tests/golden.rs` checks
every pair. The payloads are committed; the tests need no Python.

Rerun (only to add or change vectors), from the repository root:

    pip install msgspec==0.23.0
    python3 server/events/tests/data/make_vectors.py

Sources of the struct definitions:
  vLLM 0.33.0        vllm/distributed/kv_events.py (wheel vllm-0.33.0)
  vLLM, array events the same file before events became tagged maps: events
                     array_like with medium and lora_name (third-party copies,
                     and llm-d's positional decoder, list this layout)
  vLLM, oldest       commit b4e69e0a of the same file: 2-element batch,
                     array events ending at lora_id
  SGLang 0.5.23      sglang/srt/disaggregation/kv_events.py (wheel
                     sglang-0.5.23); hashes from hash_str_to_int64 in
                     sglang/srt/mem_cache/utils.py (signed int64)
  SGLang, array events  the same file before its events became tagged maps:
                     array_like events with medium, BlockStoredWithMetadata
  SGLang, oldest     commit 006d053f of the same file: 2-element batch,
                     array events ending at lora_id
  map-form batch     no engine sends one: the vLLM 0.33 and SGLang 0.5.23
                     batch structs without array_like, to cover that branch
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Optional, Union

import msgspec

OUT = Path(__file__).resolve().parent
ENCODER = msgspec.msgpack.Encoder()


def sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def vllm_int(text: str) -> int:
    """vLLM's maybe_convert_block_hash: the digest's last 8 bytes, unsigned."""
    return int.from_bytes(sha256(text), "big") & ((1 << 64) - 1)


def sglang_int(text: str) -> int:
    """SGLang's hash_str_to_int64: the hex digest's first 16 digits, signed."""
    value = int(sha256(text).hex()[:16], 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def xxhash_like(text: str) -> bytes:
    """A 16-byte digest, the length of vLLM's xxhash / xxhash_cbor."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def expected_hash(h: Union[int, bytes]) -> int:
    """The decoding rule: ints as their low 64 bits, bytes as the last 8."""
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:], "big")
    return h & ((1 << 64) - 1)


# --- vLLM 0.33.0 ------------------------------------------------------------


class V33Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class V33Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class V33Stored(V33Event, tag="BlockStored"):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    session_id: Optional[str] = None
    lookahead_token_ids: Optional[list[list[int]]] = None


class V33Removed(V33Event, tag="BlockRemoved"):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


class V33Cleared(V33Event, tag="AllBlocksCleared"):
    pass


class V33Future(V33Event, tag="BlockPinned"):
    """An event type a newer engine might add."""

    block_hashes: list[int]
    pinned_by: list[tuple[str, int]]


class V33MapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


# --- vLLM, array events with medium and lora_name ----------------------------


class VArrBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class VArrEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class VArrStored(VArrEvent, tag="BlockStored"):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]


class VArrRemoved(VArrEvent, tag="BlockRemoved"):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]


class VArrCleared(VArrEvent, tag="AllBlocksCleared"):
    pass


# --- vLLM, oldest (b4e69e0a) and SGLang, oldest (006d053f) ------------------


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class OldRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class OldCleared(OldEvent, tag="AllBlocksCleared"):
    pass


class OldFuture(OldEvent, tag="KvCacheResized"):
    num_blocks: int


# --- SGLang 0.5.23 -------------------------------------------------------------


class StorageMedium(str, enum.Enum):
    GPU = "GPU"
    CPU = "CPU_PINNED"
    DISK = "DISK"
    EXTERNAL = "EXTERNAL"


class SgBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


class SgEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class SgStored(SgEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class SgRemoved(SgEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str] = None


class SgCleared(SgEvent, tag="AllBlocksCleared"):
    pass


class SgMapBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


# --- SGLang, array events with medium ------------------------------------------


class SgArrEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class SgArrStored(SgArrEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None


class SgMetadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class SgArrStoredWithMetadata(SgArrStored, tag="BlockStored", kw_only=True):
    metadata: SgMetadata


class SgArrRemoved(SgArrEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str] = None


class SgArrCleared(SgArrEvent, tag="AllBlocksCleared"):
    pass


# --- Expected values -------------------------------------------------------------

KNOWN = {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def expected_extra_keys(keys: Any) -> Any:
    """vLLM's untagged per-block keys as the test reads them: a string,
    an [identifier, offset] pair, or {"hex": ...} for bytes; [] when every
    block's entry is nil (the decoder keeps nothing then)."""
    if not keys or all(k is None for k in keys):
        return []

    def one(k: Any) -> Any:
        if isinstance(k, bytes):
            return {"hex": k.hex()}
        if isinstance(k, (tuple, list)):
            return [k[0], k[1]]
        return k

    return [None if block is None else [one(k) for k in block] for block in keys]


def expected_event(e: Any) -> Any:
    name = type(e).__struct_config__.tag
    if name == "BlockStored":
        parent = e.parent_block_hash
        medium = getattr(e, "medium", None)
        return {
            "Stored": {
                "hashes": [expected_hash(h) for h in e.block_hashes],
                "parent": None if parent is None else expected_hash(parent),
                "tokens": list(e.token_ids),
                "block_size": e.block_size,
                "lora_name": getattr(e, "lora_name", None),
                "medium": None if medium is None else str(getattr(medium, "value", medium)),
                # SGLang's salt: a field of BlockStored, or in the metadata
                # of BlockStoredWithMetadata.
                "cache_salt": getattr(e, "cache_salt", None)
                or getattr(getattr(e, "metadata", None), "cache_salt", None),
                "extra_keys": expected_extra_keys(getattr(e, "extra_keys", None)),
                "lookahead": getattr(e, "lookahead_token_ids", None) is not None,
                "group": getattr(e, "group_idx", None),
                "group_kind": getattr(e, "kv_cache_spec_kind", None),
                "sliding_window": getattr(e, "kv_cache_spec_sliding_window", None),
            }
        }
    if name == "BlockRemoved":
        medium = getattr(e, "medium", None)
        return {
            "Removed": {
                "hashes": [expected_hash(h) for h in e.block_hashes],
                "medium": None if medium is None else str(getattr(medium, "value", medium)),
                "group": getattr(e, "group_idx", None),
            }
        }
    if name == "AllBlocksCleared":
        return "Cleared"
    raise ValueError(name)


def write(name: str, engine: str, batch: Any) -> None:
    payload = ENCODER.encode(batch)
    rank = getattr(batch, "data_parallel_rank", getattr(batch, "attn_dp_rank", None))
    known = [e for e in batch.events if type(e).__struct_config__.tag in KNOWN]
    expected = {
        "engine": engine,
        "ts_bits": struct.unpack(">Q", struct.pack(">d", batch.ts))[0],
        "data_parallel_rank": rank,
        "unknown_events": len(batch.events) - len(known),
        "events": [expected_event(e) for e in known],
    }
    (OUT / f"{name}.msgpack").write_bytes(payload)
    (OUT / f"{name}.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"{name}: {len(payload)} bytes, {len(batch.events)} events")


def tokens(start: int, n: int) -> list[int]:
    # Mixed widths on the wire: fixint, uint8, uint16, uint32.
    widths = [5, 200, 40_000, 150_000]
    return [(start + i * 7919 + widths[i % 4]) % 200_000 for i in range(n)]


def v33_stored(hashes: list[Any], parent: Any, token_ids: list[int], **fields: Any) -> V33Stored:
    """A vLLM 0.33 store of 16-token blocks in the GPU pool without LoRA,
    but for what `fields` set."""
    plain = {"block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}
    return V33Stored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=token_ids, **{**plain, **fields}
    )


def sg_stored(hashes: list[int], parent: Optional[int], token_ids: list[int], **fields: Any) -> SgStored:
    """An SGLang 0.5.23 store of one-token blocks without LoRA, but for
    what `fields` set."""
    return SgStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=token_ids,
        block_size=1,
        lora_id=None,
        **fields,
    )


def main() -> None:
    ts = 1_757_500_000.123_456_7

    # vLLM 0.33, default int hashes (often >= 2^63), the GPU pool's fields,
    # an offloading connector's CPU store with LoRA, session and lookahead.
    h = [vllm_int(f"v33-{i}") for i in range(5)]
    assert any(x >= 1 << 63 for x in h)
    write(
        "vllm_0_33_int_hashes",
        "vLLM 0.33.0",
        V33Batch(
            ts,
            [
                v33_stored(
                    h[:3],
                    None,
                    tokens(0, 48),
                    extra_keys=[None, None, None],
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                ),
                V33Removed(block_hashes=[h[0]], medium="GPU", group_idx=0),
                v33_stored(
                    h[3:],
                    h[2],
                    tokens(48, 32),
                    lora_id=7,
                    medium="CPU",
                    lora_name="sql-adapter",
                    extra_keys=[("sql-adapter", ("mm-hash", 0)), ("sql-adapter", "salt")],
                    group_idx=1,
                    kv_cache_spec_kind="sliding_window",
                    kv_cache_spec_sliding_window=4096,
                    locality="LOCAL",
                    ownership="tier-1",
                    session_id="session-42",
                    lookahead_token_ids=[[1, 2], [3, 4]],
                ),
                V33Removed(block_hashes=h[3:], medium="STORAGE", locality="REMOTE"),
                V33Cleared(),
            ],
            0,
        ),
    )

    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: raw sha256 digests (32 bytes).
    d = [sha256(f"v33-bytes-{i}") for i in range(3)]
    write(
        "vllm_0_33_sha256_bytes",
        "vLLM 0.33.0, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, sha256",
        V33Batch(
            ts + 1,
            [
                v33_stored(
                    d[1:],
                    d[0],
                    tokens(16, 32),
                    extra_keys=[None, None],
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                ),
                V33Removed(block_hashes=[d[2]], medium="GPU", group_idx=0),
            ],
            0,
        ),
    )

    # xxhash / xxhash_cbor digests are 16 bytes.
    x = [xxhash_like(f"v33-xx-{i}") for i in range(2)]
    write(
        "vllm_0_33_xxhash_bytes",
        "vLLM 0.33.0, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, xxhash",
        V33Batch(
            ts + 2,
            [
                v33_stored(x, None, tokens(0, 32)),
                V33Removed(block_hashes=x[::-1], medium=None),
            ],
            3,
        ),
    )

    # An event type this decoder does not know, between known ones, at DP rank 1.
    write(
        "vllm_0_33_unknown_event",
        "vLLM 0.33.0 with an event type from a newer engine",
        V33Batch(
            ts + 3,
            [
                V33Removed(block_hashes=[h[4]], medium="GPU", group_idx=0),
                V33Future(block_hashes=[h[1], h[2]], pinned_by=[("req-1", 2), ("req-2", 3)]),
                v33_stored([h[4]], h[3], tokens(64, 16)),
                V33Future(block_hashes=[], pinned_by=[]),
            ],
            1,
        ),
    )

    # vLLM, events still array_like, with medium and lora_name.
    write(
        "vllm_array_events",
        "vLLM, array events with medium and lora_name",
        VArrBatch(
            ts + 4,
            [
                VArrStored(h[:2], None, tokens(0, 32), 16, None, "GPU", None),
                VArrStored(h[2:4], h[1], tokens(32, 32), 16, 3, "GPU", "chat-lora"),
                VArrRemoved([h[0], h[1]], "GPU"),
                VArrCleared(),
            ],
            2,
        ),
    )

    # vLLM, oldest: 2-element batch, array events up to lora_id.
    write(
        "vllm_oldest",
        "vLLM b4e69e0a",
        OldBatch(
            ts + 5,
            [
                OldStored(h[:2], None, tokens(0, 32), 16, None),
                OldFuture(1024),
                OldRemoved([h[1]]),
                OldCleared(),
            ],
        ),
    )

    # SGLang 0.5.23: signed int64 hashes, page size 1 (one token a block),
    # medium enum values, LoRA name, salt and session, attn_dp_rank.
    s = [sglang_int(f"sg-{i}") for i in range(6)]
    assert any(x < 0 for x in s)
    write(
        "sglang_0_5_23",
        "SGLang 0.5.23",
        SgBatch(
            ts + 6,
            [
                sg_stored(s[:4], None, tokens(0, 4), medium=StorageMedium.GPU),
                sg_stored(
                    s[4:],
                    s[3],
                    tokens(4, 2),
                    medium=StorageMedium.CPU,
                    cache_salt="tenant-a",
                    session_id="sess-1",
                    lora_name="adapter-x",
                ),
                SgRemoved(block_hashes=[s[5], s[4]], medium=StorageMedium.DISK),
                SgRemoved(block_hashes=[s[0]]),
                SgCleared(),
            ],
            0,
        ),
    )

    # SGLang, array events with medium; a salted store carries a metadata map.
    write(
        "sglang_array_events",
        "SGLang, array events with medium and BlockStoredWithMetadata",
        SgBatch(
            ts + 7,
            [
                SgArrStored(s[:2], None, tokens(0, 2), 1, None, StorageMedium.GPU),
                SgArrStoredWithMetadata(
                    s[2:3],
                    s[1],
                    tokens(2, 1),
                    1,
                    None,
                    StorageMedium.EXTERNAL,
                    metadata=SgMetadata(cache_salt="tenant-b"),
                ),
                SgArrRemoved(s[:1], StorageMedium.CPU),
                SgArrRemoved(s[1:2]),
                SgArrCleared(),
            ],
            1,
        ),
    )

    # SGLang, oldest: 2-element batch, array events, signed hashes.
    write(
        "sglang_oldest",
        "SGLang 006d053f",
        OldBatch(
            ts + 8,
            [
                OldStored(s[:3], None, tokens(0, 3), 1, None),
                OldRemoved(s[1:3]),
            ],
        ),
    )

    # Map-form batches: not sent by any engine; accepted all the same.
    write(
        "map_batch_vllm",
        "vLLM 0.33.0 batch struct without array_like (no engine sends this)",
        V33MapBatch(
            ts + 9,
            [
                v33_stored([h[0]], None, tokens(0, 16)),
            ],
            4,
        ),
    )
    write(
        "map_batch_sglang",
        "SGLang 0.5.23 batch struct without array_like (no engine sends this)",
        SgMapBatch(ts + 10, [SgRemoved(block_hashes=[s[2]], medium=StorageMedium.GPU)], None),
    )


if __name__ == "__main__":
    main()
