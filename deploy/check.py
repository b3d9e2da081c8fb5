"""Holds deploy/ to Kubernetes and to the server (run by check.sh).

1. The files kustomization.yaml lists are exactly deploy/'s other *.yaml
   files, and each validates, strictly (no unknown field), against the
   Kubernetes version given.
2. The server starts as statefulset.yaml runs it: the image's environment,
   the container's env and args, the ConfigMap's file, each volume a
   directory here. Only the listeners move, to free ports on loopback
   (through the environment, which wins over the file). The liveness and
   startup probes must answer 200, the readiness probe must answer (503
   while the server fills from peers whose names do not resolve here), and
   SIGTERM must stop the server with status 0 within
   terminationGracePeriodSeconds.

Usage: check.py SERVER_BINARY WORK_DIR TLS_DIR KUBERNETES_VERSION
"""

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent

# What the image sets besides its entrypoint (the server): its environment.
IMAGE_ENV = {
    "PREFIX_INDEX_DATA_DIR": "/data",
    "PREFIX_INDEX_LISTEN": "0.0.0.0:7070",
    "PREFIX_INDEX_METRICS_LISTEN": "0.0.0.0:7071",
    "PREFIX_INDEX_HTTP_LISTEN": "0.0.0.0:8443",
}

# Stand-ins for the downward API's fields.
FIELDS = {
    "metadata.namespace": "prefix-index",
    "metadata.name": "prefix-index-0",
    "spec.nodeName": "node-0",
    "status.podIP": "127.0.0.1",
    "status.hostIP": "127.0.0.1",
}

# The settings that bind a port, and their environment variables.
LISTENERS = {
    "listen": "PREFIX_INDEX_LISTEN",
    "metrics-listen": "PREFIX_INDEX_METRICS_LISTEN",
    "http-listen": "PREFIX_INDEX_HTTP_LISTEN",
    "engine-listen": "PREFIX_INDEX_ENGINE_LISTEN",
}

# How long the server may take to answer its liveness probe.
START_TIMEOUT = 30

# No proxy, whatever the environment says: the server is on loopback.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fail(why):
    sys.exit(f"deploy: {why}")


def load(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def listed_files():
    """The files kustomization.yaml lists, held to the directory."""
    (kustomization,) = load("kustomization.yaml")
    listed = kustomization["resources"]
    present = sorted(
        p.relative_to(DEPLOY).as_posix()
        for p in [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
        if p.name != "kustomization.yaml"
    )
    missing = sorted(set(listed) - set(present))
    unlisted = sorted(set(present) - set(listed))
    if missing:
        fail(f"kustomization.yaml lists files that do not exist: {missing}")
    if unlisted:
        fail(f"files that kustomization.yaml does not list: {unlisted}")
    return listed


def validate(files, version):
    tool = Path(sys.executable).parent / "kubernetes-validate"
    run = subprocess.run(
        [tool, "--strict", "--quiet", "--kubernetes-version", version, *files],
        cwd=DEPLOY,
    )
    if run.returncode != 0:
        fail(f"a manifest does not validate against Kubernetes {version}")


def expand(value, env):
    """Kubernetes' $(VAR) expansion of args and env values ($$ escapes)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        value,
    )


def mount_volumes(sts, container, objects, work, tls):
    """Each of the container's volumes as a directory here, by mount path:
    a ConfigMap's keys as files, the TLS Secret as check.sh made it, the
    rest empty."""
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
    configmaps = {
        d["metadata"]["name"]: d.get("data", {}) for d in objects if d["kind"] == "ConfigMap"
    }
    mounts = {}
    for mount in container.get("volumeMounts", []):
        name, volume = mount["name"], volumes.get(mount["name"], {})
        here = work / "volumes" / name
        if "configMap" in volume:
            here.mkdir(parents=True)
            for key, text in configmaps[volume["configMap"]["name"]].items():
                (here / key).write_text(text)
        elif "secret" in volume:
            here = tls
        elif name in claims or "emptyDir" in volume:
            here.mkdir(parents=True)
        else:
            fail(f"volume {name} is of a kind this check does not know")
        mounts[mount["mountPath"]] = here
    return mounts


def command(container, mounts):
    """The container's args and environment, container paths mapped here."""

    def local(value):
        flag, eq, path = value.partition("=")
        if not (value.startswith("--") and eq):
            flag, eq, path = "", "", value
        for at, here in mounts.items():
            if path == at or path.startswith(at + "/"):
                return f"{flag}{eq}{here}{path[len(at):]}"
        return value

    # The image's environment, then the container's env in order, each
    # entry able to name the ones before it.
    env = dict(IMAGE_ENV)
    for var in container.get("env", []):
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif field in FIELDS:
            env[var["name"]] = FIELDS[field]
        else:
            fail(f"env {var['name']} comes from a source this check does not know")
    args = [local(expand(a, env)) for a in container.get("args", [])]
    return args, {k: local(v) for k, v in env.items()}


def free_port():
    """A port free for both TCP and UDP on loopback: QUIC takes UDP."""
    while True:
        with socket.socket() as tcp, socket.socket(type=socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = tcp.getsockname()[1]
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def move_listeners(args, env):
    """Every listener to a free port on loopback, through the environment;
    returns the port here of each container port."""
    for arg in args:
        if arg.lstrip("-").split("=")[0] in LISTENERS:
            fail(f"{arg}: a flag wins over the environment; statefulset.yaml leaves the listeners to the image")
    config = {}
    if "PREFIX_INDEX_CONFIG" in env:
        config = tomllib.loads(Path(env["PREFIX_INDEX_CONFIG"]).read_text())
    ports = {}
    for key, var in LISTENERS.items():
        value = env.get(var, config.get(key, "off"))
        if value == "off":
            continue
        port = int(value.rsplit(":", 1)[1])
        ports[port] = free_port()
        scheme = "tcp://" if value.startswith("tcp://") else ""
        env[var] = f"{scheme}127.0.0.1:{ports[port]}"
    return ports


def get(url):
    """The status of GET url, or None if nothing answers."""
    try:
        with OPENER.open(url, timeout=2) as answer:
            return answer.status
    except urllib.error.HTTPError as answer:
        return answer.code
    except (OSError, http.client.HTTPException):
        return None


def main():
    server, work, tls, version = sys.argv[1:]
    work, tls = Path(work), Path(tls)
    files = listed_files()
    validate(files, version)
    print(f"deploy: {len(files)} files listed, each valid for Kubernetes {version} (strict)")

    objects = [d for f in files for d in load(f)]
    (sts,) = [d for d in objects if d["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = mount_volumes(sts, container, objects, work, tls)
    args, env = command(container, mounts)
    ports = move_listeners(args, env)
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}

    def probe(kind):
        """The URL here of the container's probe `kind`."""
        http = container.get(kind, {}).get("httpGet")
        if http is None:
            fail(f"the container has no {kind} by HTTP")
        port = named.get(http["port"], http["port"])
        if port not in ports:
            fail(f"{kind}'s port {http['port']} is no listener of the server")
        return f"http://127.0.0.1:{ports[port]}{http['path']}"

    log = open(work / "server.log", "w+")

    def failed(why):
        log.seek(0)
        fail(f"{why}; its log:\n{log.read()}")

    started = time.monotonic()
    proc = subprocess.Popen(
        [server, *args],
        env={**env, "PATH": os.environ.get("PATH", "")},
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        alive = [k for k in ("startupProbe", "livenessProbe") if k in container]
        waiting = {probe(k) for k in alive}
        while waiting:
            if proc.poll() is not None:
                failed(f"the server exited with status {proc.returncode}")
            if time.monotonic() - started > START_TIMEOUT:
                failed(f"no 200 from {sorted(waiting)} within {START_TIMEOUT} s")
            waiting = {url for url in waiting if get(url) != 200}
            time.sleep(0.1)
        healthy = time.monotonic() - started
        ready = get(probe("readinessProbe"))
        if ready not in (200, 503):
            failed(f"the readinessProbe answered {ready}")
    finally:
        proc.send_signal(signal.SIGTERM)
        grace = pod.get("terminationGracePeriodSeconds", 30)
        stopping = time.monotonic()
        try:
            status = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            failed(f"the server did not stop within {grace} s of SIGTERM")
    if status != 0:
        failed(f"the server exited with status {status} after SIGTERM")
    print(
        f"deploy: the server started as statefulset.yaml runs it "
        f"({len(args)} args, {len(mounts)} volumes, {len(ports)} listeners): "
        f"{' and '.join(alive)} 200 after {healthy:.1f} s, readinessProbe {ready}; "
        f"SIGTERM stopped it with status 0 in {time.monotonic() - stopping:.1f} s"
    )


if __name__ == "__main__":
    main()
