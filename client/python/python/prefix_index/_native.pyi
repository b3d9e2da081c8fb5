"""Types of the native module (PyO3 over the Rust client)."""

from typing import Awaitable, Iterable, Mapping, Optional, Sequence, Tuple, final

from typing_extensions import disjoint_base

__all__ = [
    "Index",
    "Client",
    "Cluster",
    "LookupResult",
    "DetailResult",
    "Stats",
    "EngineState",
    "text_key",
    "token_key",
    "PrefixIndexError",
    "DeadlineExceeded",
    "Disconnected",
    "ServerError",
    "InvalidRequest",
    "ConnectFailed",
]

class PrefixIndexError(Exception):
    """Every error of this package."""

class DeadlineExceeded(PrefixIndexError):
    """No answer within the call's deadline (the server may still apply it)."""

class Disconnected(PrefixIndexError):
    """No connection now; the client reconnects in the background."""

class ServerError(PrefixIndexError):
    """The server refused the request."""
    code: int
    """The protocol's error code (docs/protocol.md)."""
    name: Optional[str]
    """Its name, e.g. ``"key_too_long"`` (None for a code this build lacks)."""

class InvalidRequest(PrefixIndexError):
    """The request breaks a protocol limit and was not sent."""
    code: int
    name: Optional[str]

class ConnectFailed(PrefixIndexError):
    """The client could not be set up or connect."""

@final
class LookupResult:
    key_blocks: int
    """Blocks in the key the server looked up."""
    matches: list[Tuple[str, int]]
    """``(pod, blocks)`` for every pod holding at least one leading block,
    by blocks descending, then pod name."""

@final
class DetailResult:
    key_blocks: int
    """Blocks in the key the server looked up."""
    matches: list[Tuple[str, int, int, str]]
    """``(pod, blocks, lower_blocks, view)`` for the lookup's pods in its
    order, then pods held by a lower cache tier alone: ``lower_blocks`` is
    the run after ``blocks`` that a lower tier (CPU memory, storage) holds,
    ``view`` how far the answer can be trusted (``"gateway"``,
    ``"exact"``, ``"learning"``, ``"replaying"``, ``"disconnected"``,
    ``"speculative"``, ``"suspect"``)."""

@final
class Stats:
    models: int
    pods: int
    nodes: int
    tree_blocks: int
    entries: int
    bytes: int

@final
class EngineState:
    pod: str
    model: str
    endpoint: str
    replay: Optional[str]
    block_size: int
    topic: str
    media: list[str]
    connected: bool
    last_seq: Optional[int]
    events: int
    blocks_stored: int
    blocks_removed: int
    resyncs: int
    replays: int
    orphaned: int
    decode_errors: int
    lag_ms: int
    last_error: Optional[str]

@disjoint_base
class Index:
    """The calls of Client and Cluster, each blocking and awaitable."""

    def lookup(
        self, model: str, key: Sequence[int], candidates: Optional[Sequence[str]] = None
    ) -> LookupResult: ...
    def lookup_async(
        self, model: str, key: Sequence[int], candidates: Optional[Sequence[str]] = None
    ) -> Awaitable[LookupResult]: ...
    def lookup_detail(
        self, model: str, key: Sequence[int], candidates: Optional[Sequence[str]] = None
    ) -> DetailResult: ...
    def lookup_detail_async(
        self, model: str, key: Sequence[int], candidates: Optional[Sequence[str]] = None
    ) -> Awaitable[DetailResult]: ...
    def lookup_many(
        self,
        model: str,
        keys: Sequence[Sequence[int]],
        candidates: Optional[Sequence[str]] = None,
    ) -> list[LookupResult]: ...
    def lookup_many_async(
        self,
        model: str,
        keys: Sequence[Sequence[int]],
        candidates: Optional[Sequence[str]] = None,
    ) -> Awaitable[list[LookupResult]]: ...
    def lookup_tokens(
        self,
        model: str,
        tokens: Sequence[int],
        candidates: Optional[Sequence[str]] = None,
        block_tokens: int = 16,
        *,
        cache_salt: Optional[str] = None,
        mm_items: Optional[Sequence[tuple[str, int, int]]] = None,
        prompt_embeds: Optional[Sequence[bytes]] = None,
    ) -> LookupResult: ...
    def lookup_tokens_async(
        self,
        model: str,
        tokens: Sequence[int],
        candidates: Optional[Sequence[str]] = None,
        block_tokens: int = 16,
        *,
        cache_salt: Optional[str] = None,
        mm_items: Optional[Sequence[tuple[str, int, int]]] = None,
        prompt_embeds: Optional[Sequence[bytes]] = None,
    ) -> Awaitable[LookupResult]: ...
    def insert(self, model: str, key: Sequence[int], pod: str) -> None: ...
    def insert_async(self, model: str, key: Sequence[int], pod: str) -> Awaitable[None]: ...
    def receipt(
        self,
        model: str,
        key: Sequence[int],
        pod: str,
        predicted_blocks: int,
        cached_tokens: int,
        prompt_tokens: Optional[int] = None,
    ) -> None: ...
    def receipt_async(
        self,
        model: str,
        key: Sequence[int],
        pod: str,
        predicted_blocks: int,
        cached_tokens: int,
        prompt_tokens: Optional[int] = None,
    ) -> Awaitable[None]: ...
    def remove_pod(self, pod: str) -> bool: ...
    def remove_pod_async(self, pod: str) -> Awaitable[bool]: ...
    def set_pod_capacity(self, pod: str, blocks: int) -> None: ...
    def set_pod_capacity_async(self, pod: str, blocks: int) -> Awaitable[None]: ...
    def stats(self) -> Stats: ...
    def stats_async(self) -> Awaitable[Stats]: ...
    def ping(self) -> None: ...
    def ping_async(self) -> Awaitable[None]: ...

@final
class Client(Index):
    """A connection to one server, at ``address``: ``host:port``, an IP
    address or a name resolved again before every reconnection (a restarted
    pod may come back at another address)."""

    def __new__(
        cls,
        address: str,
        *,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        server_name: str = "localhost",
        deadline: float = 0.002,
        connect_timeout: float = 5.0,
        idle_timeout: float = 5.0,
        limits: Optional[Mapping[str, int]] = None,
    ) -> Client: ...
    def subscribe_engine(
        self,
        pod: str,
        model: str,
        endpoint: str,
        *,
        replay: Optional[str] = None,
        block_size: int = 16,
        topic: str = "",
        media: Sequence[str] = ...,  # ("GPU",)
    ) -> None: ...
    def unsubscribe_engine(self, pod: str) -> bool: ...
    def list_engines(self) -> list[EngineState]: ...
    def is_connected(self) -> bool: ...
    def close(self) -> None: ...

@final
class Cluster(Index):
    """Several servers, each model on ``replicas`` of them by rendezvous
    hashing: writes go to all of them, reads to one, failing over.
    ``servers`` pairs each server's stable name (the placement key) with its
    ``host:port`` address, a name resolved again before every
    reconnection."""

    def __new__(
        cls,
        servers: Iterable[Tuple[str, str]],
        *,
        replicas: int = 1,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        server_name: str = "localhost",
        deadline: float = 0.002,
        connect_timeout: float = 5.0,
        idle_timeout: float = 5.0,
        limits: Optional[Mapping[str, int]] = None,
    ) -> Cluster: ...
    def server_for(self, model: str) -> str: ...
    def replicas_of(self, model: str) -> list[str]: ...

def text_key(text: str, block_bytes: int = 64) -> list[int]: ...
def token_key(
    tokens: Sequence[int],
    block_tokens: int = 16,
    *,
    cache_salt: Optional[str] = None,
    mm_items: Optional[Sequence[tuple[str, int, int]]] = None,
    prompt_embeds: Optional[Sequence[bytes]] = None,
) -> list[int]: ...
