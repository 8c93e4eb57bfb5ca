"""Shared test settings: one thread (CI has 2 cores), deterministic seeds, bounded hypothesis runs."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def torchrun_train(args, out_dir, cwd, timeout: int):
    """``torchrun --standalone --nproc_per_node 2 -m manifold_muon_lab.train ARGS --out-dir OUT_DIR`` (gloo on the
    CPU), hash seed fixed and one thread per rank; returns the CompletedProcess (text output captured)."""
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2",
                           "-m", "manifold_muon_lab.train", *args, "--out-dir", str(out_dir)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
