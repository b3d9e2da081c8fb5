"""Client of the shared prefix index for LLM inference gateways.

Ask a prefix-index server which pods hold the KV cache of a prompt's longest
prefix, and tell it where a prompt was routed. The calls run on the Rust
client (QUIC, pipelined, with deadlines and reconnection); each exists as a
blocking call (``lookup``) and an asyncio awaitable (``lookup_async``).

    from prefix_index import Client, token_key

    client = Client("127.0.0.1:7070", ca="prefix-index-data/cert.pem")
    key = token_key(prompt_token_ids)
    found = client.lookup("llama", key, candidates=["pod-a", "pod-b"])
    for pod, blocks in found.matches:
        ...
    client.insert("llama", key, "pod-a")
"""

from ._native import (
    Client,
    Cluster,
    ConnectFailed,
    DeadlineExceeded,
    DetailResult,
    Disconnected,
    EngineState,
    Index,
    InvalidRequest,
    LookupResult,
    PrefixIndexError,
    ServerError,
    Stats,
    text_key,
    token_key,
)

__all__ = [
    "Client",
    "Cluster",
    "ConnectFailed",
    "DeadlineExceeded",
    "DetailResult",
    "Disconnected",
    "EngineState",
    "Index",
    "InvalidRequest",
    "LookupResult",
    "PrefixIndexError",
    "ServerError",
    "Stats",
    "text_key",
    "token_key",
]
