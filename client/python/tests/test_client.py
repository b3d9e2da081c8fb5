"""The package against a real server: sync and asyncio calls, key builders,
errors as exceptions, a cluster's placement, and the stubs."""

import ast
import asyncio
import socket
import time
from pathlib import Path

import pytest

import prefix_index
from prefix_index import (
    Client,
    Cluster,
    ConnectFailed,
    DeadlineExceeded,
    InvalidRequest,
    PrefixIndexError,
    ServerError,
    text_key,
    token_key,
)

# Generous: a loaded CI machine; the default 2 ms is a gateway's.
DEADLINE = 5.0


def connect(server, **kw):
    return Client(server.address, ca=server.ca, deadline=kw.pop("deadline", DEADLINE), **kw)


def test_keys_follow_the_documented_vectors():
    llama = [128000, 9906, 1917, 13, 220, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1001]
    tokens = list(range(16)) + llama + [7, 7, 7]
    assert token_key(tokens) == [0x79C2079C74A8EE4D, 0xAB0AD845CFD79968]
    fox = "The quick brown fox jumps over the lazy dog. Pack my box with fi"
    assert text_key("a" * 64 + fox + "xyz") == [0x2DDDCEF07D26EE8C, 0xBC3B1760E084A797]
    assert text_key("short") == []
    assert len(token_key(list(range(40)), block_tokens=8)) == 5


def test_token_keys_carry_the_requests_identity():
    # The identity vectors of docs/protocol.md ("Keys"), computed with the
    # Python xxhash package from the rule as written there.
    tokens = list(range(32))
    assert token_key(tokens, cache_salt="tenant-a")[0] == 0xAC64A7D7A02B4A1E
    image = [("img-a", 8, 16)]
    assert token_key(tokens, mm_items=image) == [0xA281CE7BD569058D, 0x06DE7AD12D1CF9AC]
    both = token_key(tokens, cache_salt="tenant-a", mm_items=image)
    assert both[0] == 0xD40725C848688234
    assert token_key(tokens, cache_salt="") == token_key(tokens)
    assert len(token_key(tokens, prompt_embeds=[b"\x01" * 32])) == 1


def test_blocking_calls(server):
    c = connect(server)
    c.ping()
    key = token_key(list(range(64)))
    c.insert("m", key, "pod-a")
    c.insert("m", key[:2], "pod-b")
    found = c.lookup("m", key)
    assert found.key_blocks == 4
    assert found.matches == [("pod-a", 4), ("pod-b", 2)]
    assert c.lookup("m", key, candidates=["pod-b", "nobody"]).matches == [("pod-b", 2)]
    assert c.lookup_tokens("m", list(range(70))).matches == [("pod-a", 4), ("pod-b", 2)]
    assert c.lookup("other", key).matches == []
    # Pods fed by gateways' inserts: no lower tier, a gateway's view.
    detail = c.lookup_detail("m", key)
    assert (detail.key_blocks, detail.matches) == (
        4,
        [("pod-a", 4, 0, "gateway"), ("pod-b", 2, 0, "gateway")],
    )
    many = c.lookup_many("m", [key, key[:1], [99]])
    assert [(r.key_blocks, r.matches) for r in many] == [
        (4, [("pod-a", 4), ("pod-b", 2)]),
        (1, [("pod-a", 1), ("pod-b", 1)]),
        (1, []),
    ]
    c.set_pod_capacity("pod-a", 100)
    stats = c.stats()
    assert (stats.models, stats.pods, stats.entries) == (1, 2, 6)
    assert c.remove_pod("pod-b") is True
    assert c.remove_pod("pod-b") is False
    assert c.lookup("m", key).matches == [("pod-a", 4)]
    # A salted request's key is its own: only the salt finds it.
    salted = token_key(list(range(64)), cache_salt="t")
    c.insert("m", salted, "pod-s")
    assert c.lookup_tokens("m", list(range(64)), cache_salt="t").matches == [("pod-s", 4)]
    assert c.lookup_tokens("m", list(range(64))).matches == [("pod-a", 4)]
    assert c.list_engines() == []
    assert c.is_connected()
    c.close()


def test_receipts_make_an_over_predicted_pod_suspect(server):
    c = connect(server)
    tokens = list(range(1000, 1069))  # four whole blocks and five tokens
    key = token_key(tokens)
    c.insert("receipts", key, "pod-r")
    # Eight receipts where the engine reused one block of the four
    # promised: the default --receipt-suspect.
    for _ in range(7):
        assert c.receipt("receipts", key, "pod-r", 4, 16, prompt_tokens=len(tokens)) is None
    assert c.lookup_detail("receipts", key).matches == [("pod-r", 4, 0, "gateway")]

    async def last():
        return await c.receipt_async("receipts", key, "pod-r", 4, 16, len(tokens))

    assert asyncio.run(last()) is None
    assert c.lookup_detail("receipts", key).matches == [("pod-r", 4, 0, "suspect")]
    # A pod the index does not hold: refused with its own code.
    with pytest.raises(ServerError) as e:
        c.receipt("receipts", key, "nobody", 4, 64)
    assert (e.value.code, e.value.name) == (18, "bad_receipt")
    c.close()


def test_a_128k_token_prompt_is_found_whole(server):
    # The default key limit covers a million tokens; 128,000 are 8,000 blocks.
    c = connect(server)
    prompt = [i % 50_000 for i in range(128_000)]
    c.insert("long", token_key(prompt), "pod-long")
    found = c.lookup_tokens("long", prompt)
    assert (found.key_blocks, found.matches) == (8_000, [("pod-long", 8_000)])
    c.close()


def test_asyncio_calls(server):
    c = connect(server)
    keys = [token_key([i] * 16 + list(range(48))) for i in range(200)]

    async def main():
        await asyncio.gather(*(c.insert_async("m", k, f"pod-{i % 7}") for i, k in enumerate(keys)))
        found = await asyncio.gather(*(c.lookup_async("m", k) for k in keys))
        assert [r.matches for r in await c.lookup_many_async("m", keys)] == [r.matches for r in found]
        # Calls that answer nothing resolve to None, as the stubs say.
        assert await c.ping_async() is None
        assert await c.insert_async("m", keys[0], "pod-0") is None
        assert await c.set_pod_capacity_async("pod-0", 1000) is None
        stats = await c.stats_async()
        return found, stats

    found, stats = asyncio.run(main())
    for i, r in enumerate(found):
        assert r.key_blocks == 4
        assert r.matches == [(f"pod-{i % 7}", 4)]
    assert stats.pods == 7
    # The same answers as the blocking calls.
    assert [c.lookup("m", k).matches for k in keys] == [r.matches for r in found]


def test_errors_are_exceptions_with_the_protocol_code(start_server):
    server = start_server("--max-key-blocks", "8")
    c = connect(server)
    # The server's limit: refused there, with its code and name.
    with pytest.raises(ServerError) as e:
        c.insert("m", list(range(9)), "p")
    assert (e.value.code, e.value.name) == (5, "key_too_long")
    assert isinstance(e.value, PrefixIndexError)
    # The client's own limit: never sent.
    with pytest.raises(InvalidRequest) as e:
        c.insert("m", [1], "")
    assert e.value.name == "bad_name"

    async def refused():
        await c.insert_async("m", list(range(9)), "p")

    with pytest.raises(ServerError):
        asyncio.run(refused())
    # A server that stops answering: the deadline.
    quick = connect(server, deadline=0.05)
    server.pause()
    try:
        with pytest.raises(DeadlineExceeded):
            quick.lookup("m", [1])
    finally:
        server.resume()
    # The same client answers again once the server does (its first calls
    # may still meet the backlog the pause left).
    for _ in range(200):
        try:
            assert quick.lookup("m", [1]).matches == []
            break
        except DeadlineExceeded:
            time.sleep(0.01)
    else:
        pytest.fail("the client never recovered")
    with pytest.raises(ValueError):
        connect(server, deadline=0)


def test_limits_follow_a_server_configured_otherwise(start_server):
    # A server that takes longer keys and larger frames than the defaults.
    server = start_server("--max-key-blocks", "100000", "--max-frame-bytes", "2097152")
    key = list(range(70_000))
    # The defaults refuse the key before sending it.
    with pytest.raises(InvalidRequest) as e:
        connect(server).insert("m", key, "p")
    assert e.value.name == "key_too_long"
    # Given the server's limits, the client sends it.
    c = connect(server, limits={"max_key_blocks": 100_000, "max_frame_bytes": 2 << 20})
    c.insert("m", key, "p")
    assert c.lookup("m", key).matches == [("p", 70_000)]
    with pytest.raises(ValueError, match="no limit"):
        connect(server, limits={"max_keys": 1})
    with pytest.raises(ValueError, match="max_frame_bytes"):
        connect(server, limits={"max_frame_bytes": 1 << 40})


def test_connect_failures_are_exceptions(server):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(ConnectFailed):
        Client(f"127.0.0.1:{free}", ca=server.ca, connect_timeout=0.5)
    with pytest.raises(ConnectFailed):
        Client(server.address, ca="/nonexistent.pem")


def test_a_killed_server_is_found_gone_at_the_idle_timeout(start_server):
    # The server's own idle timeout is 10 minutes and the client's default
    # 5 s: only the 0.5 s given here ends the dead connection within the
    # 4 s this test waits (8 times the timeout, for a loaded machine).
    server = start_server("--idle-timeout", "10m")
    client = connect(server, idle_timeout=0.5, deadline=0.2)
    client.ping()
    server.stop()
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        try:
            client.ping()
        except prefix_index.Disconnected:
            break
        except DeadlineExceeded:
            pass
        time.sleep(0.02)
    else:
        pytest.fail("the dead connection was kept")
    with pytest.raises(ValueError):
        connect(server, idle_timeout=-1)


def test_a_cluster_places_each_model_on_one_server(start_server):
    first = start_server()
    # One certificate for both, as a CA-issued one would be.
    key = str(Path(first.ca).with_name("key.pem"))
    servers = {"s0": first, "s1": start_server("--cert", first.ca, "--key", key)}
    cluster = Cluster([(n, s.address) for n, s in servers.items()], ca=first.ca, deadline=DEADLINE)
    direct = {n: Client(s.address, ca=first.ca, deadline=DEADLINE) for n, s in servers.items()}
    models = [f"model-{i}" for i in range(12)]
    for m in models:
        cluster.insert(m, [1, 2, 3], "pod-a")
    for m in models:
        home = cluster.server_for(m)
        assert home in servers
        assert direct[home].lookup(m, [1, 2, 3]).matches == [("pod-a", 3)]
        other = next(n for n in servers if n != home)
        assert direct[other].lookup(m, [1, 2, 3]).matches == []
        assert cluster.lookup(m, [1, 2, 3]).matches == [("pod-a", 3)]
    assert len({cluster.server_for(m) for m in models}) == 2
    assert cluster.stats().entries == 3 * len(models)
    # With two replicas each model lives on both servers.
    both = Cluster([(n, s.address) for n, s in servers.items()], replicas=2, ca=first.ca, deadline=DEADLINE)
    assert sorted(both.replicas_of("model-x")) == ["s0", "s1"]
    assert both.replicas_of("model-x")[0] == both.server_for("model-x")
    both.insert("model-x", [7, 8], "pod-r")
    for n in servers:
        deadline = time.monotonic() + 5
        while direct[n].lookup("model-x", [7, 8]).matches != [("pod-r", 2)]:
            assert time.monotonic() < deadline, f"{n} never got the write"
            time.sleep(0.01)
    # Pods are global: removed from every server.
    assert cluster.remove_pod("pod-a") is True
    assert all(cluster.lookup(m, [1, 2, 3]).matches == [] for m in models)


def test_the_stubs_name_what_the_module_has():
    stub = Path(prefix_index.__file__).with_name("_native.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert declared == set(prefix_index.__all__)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        real = getattr(prefix_index, cls.name)
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                assert hasattr(real, item.name), f"{cls.name}.{item.name}"
    for name in dir(prefix_index.Client):
        if not name.startswith("_"):
            assert name in {i.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name in ("Client", "Index") for i in c.body if isinstance(i, ast.FunctionDef)}, name


def test_awaitables_survive_cancellation_and_new_loops(server):
    c = connect(server)
    c.insert("m", [1, 2], "pod-a")

    async def cancelled_then_answered():
        server.pause()
        try:
            pending = asyncio.ensure_future(c.lookup_async("m", [1, 2]))
            await asyncio.sleep(0.05)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        finally:
            server.resume()
        # The cancelled call's answer arrives later and is dropped; the
        # next ones are answered.
        found = await asyncio.gather(*(c.lookup_async("m", [1, 2]) for _ in range(500)))
        return {tuple(r.matches) for r in found}

    # A fresh event loop each time: each gets its own wake-up socket.
    for _ in range(3):
        assert asyncio.run(cancelled_then_answered()) == {(("pod-a", 2),)}

    async def refused():
        await c.set_pod_capacity_async("", 1)

    # An empty pod name is refused by the client before sending, through
    # the awaitable too.
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(refused())
    assert e.value.name == "bad_name"


def test_a_client_made_before_fork_refuses_in_the_child(server):
    import os

    c = connect(server)
    c.ping()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                c.ping()
            except PrefixIndexError as e:
                code = 0 if "os.fork()" in str(e) else 2
            # A new client in the child works.
            if code == 0:
                connect(server).ping()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    c.ping()


def test_the_readme_example_survives_a_server_that_does_not_answer(server):
    # The README's blocking example, up to the asyncio lines, run as written
    # against a server that stops answering: every call misses its 2 ms
    # deadline, and the example routes without the index instead of raising.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    imports, connect, calls = example.split("\n\n")[0], *example.split("\n\n")[1].split("\n", 1)
    assert connect.startswith("client = Client(") and "client.insert(" in calls
    connect = connect.replace("127.0.0.1:7070", server.address)
    connect = connect.replace("prefix-index-data/cert.pem", server.ca)
    scope = {"prompt_token_ids": list(range(64))}
    exec(imports + "\n" + connect, scope)  # connects while the server answers
    server.pause()
    try:
        exec(calls, scope)
    finally:
        server.resume()
    assert scope["best"] is None
