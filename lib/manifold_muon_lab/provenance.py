"""What produced a result: commit, parameters, versions, hardware, wall time; and atomic writes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["provenance", "write_json_atomic", "write_text_atomic", "Stopwatch", "summary"]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(parameters: dict | None = None, wall_time_s: float | None = None) -> dict:
    """A record of what produced a result, to store next to it."""
    import torch

    import manifold_muon

    dirty = _git("status", "--porcelain", "--untracked-files=no")
    record = {
        "commit": _git("rev-parse", "HEAD") + ("+dirty" if dirty not in ("", "unknown") else ""),
        "lib_version": manifold_muon.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "hardware": {
            "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if parameters is not None:
        record["parameters"] = parameters
    if wall_time_s is not None:
        record["wall_time_s"] = round(float(wall_time_s), 3)
    return record


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and a rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True, default=float) + "\n")


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        return False


def summary(record: dict, label: str = "") -> str:
    """One line saying what produced a result, for the line under it in a chapter."""
    hw = record.get("hardware", {})
    where = hw.get("cuda") or f"{hw.get('processor', '?')} x{hw.get('cpu_count', '?')} ({hw.get('torch_threads', '?')} threads)"
    params = record.get("parameters", {})
    seed = params.get("seed", params.get("seeds"))
    wall = record.get("wall_time_s")
    return (f"{label + ': ' if label else ''}commit {str(record.get('commit', '?'))[:12]}"
            f"{'+dirty' if str(record.get('commit', '')).endswith('+dirty') else ''}, lib {record.get('lib_version', '?')}, "
            f"torch {record.get('torch_version', '?')}, {where}"
            + (f", seed {seed}" if seed is not None else "") + (f", wall {wall:.0f} s" if wall is not None else ""))
