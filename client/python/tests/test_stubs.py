"""The type stubs (``_native.pyi``) held to the module as built: mypy's
stubtest compares every class, method, parameter and literal default the
stubs declare with what the extension really has, so a call added, renamed
or given another signature in Rust fails here until the stubs follow."""

import subprocess
import sys


def test_stubs_match_the_module():
    run = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "prefix_index._native"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
