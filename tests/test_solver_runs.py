"""runs/solver_training's trainings, enumerated once for the notebook and the time estimate."""

from pathlib import Path

import pytest

from manifold_muon_book import solver_runs
from manifold_muon_book.pipeline import load_run_preset

ROOT = Path(__file__).resolve().parents[1]
PRESET = dict(training_preset="cpu-tiny", assignments=["hetero", "all_dgram"], solvers=["lean", "lean3"],
              arm_settings={"lean3": {"inner": "lean", "inner_steps": 3}}, seeds=[1, 2],
              lr_check={"assignments": ["all_dgram"], "solvers": ["lean"], "lrs": [0.01, 0.04]})


def test_the_main_grid_then_the_learning_rate_check():
    arms = solver_runs.arms(PRESET)
    assert len(arms) == 2 * 2 * 2 + 2 * 2
    assert all(a.lr is None for a in arms[:8]) and {a.lr for a in arms[8:]} == {0.01, 0.04}
    assert {(a.assignment, a.solver) for a in arms[8:]} == {("all_dgram", "lean")}
    assert arms[0].out_dir(Path("r")) == Path("r/hetero/lean/seed1")            # the layout the base runs always had
    assert arms[-1].out_dir(Path("r")) == Path("r/all_dgram/lean/lr0.04/seed2")


def test_each_arm_trains_with_its_settings_and_rate():
    cfgs = solver_runs.configs(PRESET, ROOT / "runs" / "presets" / "training", Path("/tmp/x"))
    by = {(c.assignment, c.optimizer.get("inner_steps"), c.lr, c.seed): c for c in cfgs}
    assert by[("hetero", 3, 0.02, 1)].optimizer == {"inner": "lean", "inner_steps": 3}
    assert by[("all_dgram", None, 0.04, 2)].out_dir == "/tmp/x/all_dgram/lean/lr0.04/seed2"
    assert solver_runs.settings(PRESET, "post") == {"inner": "post"}


def test_a_check_of_an_arm_the_grid_lacks_is_refused():
    bad = {**PRESET, "lr_check": {"assignments": ["all_dgram"], "solvers": ["gram_admm"], "lrs": [0.04]}}
    with pytest.raises(ValueError, match="lr_check names gram_admm"):
        solver_runs.arms(bad)


def test_the_cpu_preset_checks_the_rates_of_the_compared_arms():
    preset = load_run_preset("solver_training", "cpu", ROOT)
    check = preset["lr_check"]
    assert {"lean", "gram_admm"} <= set(check["solvers"]) and 0.02 not in check["lrs"]
    assert len(solver_runs.arms(preset)) == 2 * 5 * 3 + 2 * 2 * 3  # 2 assignments x 5 arms x 3 seeds, then the check
