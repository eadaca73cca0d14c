"""The type stubs match the extension: every function and class is typed, with the
runtime's parameter names and defaults (mypy's stubtest)."""

import subprocess
import sys


def test_stubs_match_runtime(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "tinylm"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
