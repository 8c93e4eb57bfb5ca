"""The trainings of ``runs/solver_training.md``, enumerated once (the run notebook trains them, ``cost_model``
estimates them): every assignment x solver arm x seed at the training preset's learning rate, and the
learning-rate check (``lr_check``: some assignments and arms again at other rates, so that arms are compared
each at its best rate, not only at a rate tuned for neither).

An arm is a name with the optimizer settings it trains with: ``arm_settings`` in the preset maps a name to
``ManifoldMuon`` settings (e.g. ``lean3: {inner: lean, inner_steps: 3}``); a name without an entry is an
inner solver's name (``{inner: name}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Arm:
    """One training of the study: ``lr`` None is the training preset's own rate."""

    assignment: str
    solver: str
    seed: int
    lr: float | None = None

    def out_dir(self, root: Path) -> Path:
        rate = [] if self.lr is None else [f"lr{self.lr:g}"]
        return Path(root, self.assignment, self.solver, *rate, f"seed{self.seed}")


def settings(preset: dict, solver: str) -> dict:
    """The optimizer settings of arm ``solver``."""
    return dict((preset.get("arm_settings") or {}).get(solver, {"inner": solver}))


def arms(preset: dict) -> list[Arm]:
    """Every training of the study, the main grid first, then the learning-rate check. A check that names an
    assignment or an arm the main grid lacks is refused (its runs would have no arm at the base rate to be
    compared with)."""
    out = [Arm(a, solver, s) for s in preset["seeds"] for a in preset["assignments"] for solver in preset["solvers"]]
    check = preset.get("lr_check")
    if check:
        missing = ([a for a in check["assignments"] if a not in preset["assignments"]]
                   + [v for v in check["solvers"] if v not in preset["solvers"]])
        if missing:
            raise ValueError(f"solver_training: lr_check names {', '.join(missing)}, which the main grid does not "
                             "train; add them to assignments / solvers, or leave them out of lr_check")
        out += [Arm(a, solver, s, float(lr)) for lr in check["lrs"] for s in preset["seeds"]
                for a in check["assignments"] for solver in check["solvers"]]
    return out


def configs(preset: dict, presets_dir: Path, out_root: Path | None = None) -> list:
    """The ``TrainConfig`` of each of ``arms(preset)``, in the same order (``out_root``: where the runs write)."""
    from manifold_muon_lab.config import load_preset

    out = []
    for arm in arms(preset):
        extra = {} if arm.lr is None else {"lr": arm.lr}
        if out_root is not None:
            extra["out_dir"] = str(arm.out_dir(out_root))
        out.append(load_preset(preset["training_preset"], presets_dir, **preset.get("overrides", {}),
                               assignment=arm.assignment, seed=arm.seed, optimizer=settings(preset, arm.solver), **extra))
    return out
