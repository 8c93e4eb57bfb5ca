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
