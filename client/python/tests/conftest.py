"""A real prefix-server per test: the release binary cargo built
(PREFIX_SERVER names another), on loopback ports it picks itself."""

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


class Server:
    def __init__(self, *flags: str):
        binary = os.environ.get("PREFIX_SERVER", str(ROOT / "target/release/prefix-server"))
        self.dir = tempfile.TemporaryDirectory()
        self.log = open(os.path.join(self.dir.name, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [binary, "--data-dir", self.dir.name, "--listen", "127.0.0.1:0",
             "--metrics-listen", "off", "--snapshot-interval", "0s", *flags],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.ca = os.path.join(self.dir.name, "cert.pem")
        self.address = self._wait_for("serving listen=([0-9.:]+)")

    def _wait_for(self, pattern: str) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.log.seek(0)
            m = re.search(pattern, self.log.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.log.seek(0)
        raise RuntimeError("the server did not start:\n" + self.log.read())

    def pause(self):
        """Stops the process, and returns once it is stopped (a signal is
        delivered a moment after it is sent)."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                # The state follows the parenthesised command name.
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.005)
        raise RuntimeError("the server did not stop")

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        self.resume()
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            self.stop()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture
def start_server():
    started = []

    def start(*flags: str) -> Server:
        s = Server(*flags)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.fixture
def server(start_server):
    return start_server()
