"""One vocabulary: the settings table of lib/manifold_muon/README.md is every optimizer's signature, defaults
included, and every setting either changes what a step does or is refused."""

import inspect
import re
from pathlib import Path

import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import FSO, MACRO, SSO, ManifoldMuon, Muon, MuonH

README = Path(__file__).resolve().parents[1] / "lib" / "manifold_muon" / "README.md"
OPTIMIZERS = {c.__name__: c for c in (Muon, ManifoldMuon, MACRO, MuonH, SSO, FSO)}
ALIASES = {"spheres": ("MACRO", "MuonH", "SSO", "FSO")}


def vocabulary() -> dict:
    """{setting: {optimizer name: default}} from the README's settings table."""
    text = README.read_text()
    section = text[text.index("## Settings: one vocabulary"):]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        m = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) == 4 else None
        if not m:
            continue
        defaults = {}
        for part in cells[2].split("; "):
            names, _, value = part.partition(": ")
            value = re.fullmatch(r"`(.*)`", value.strip()).group(1)
            for name in names.split(", "):
                for n in ALIASES.get(name, (name,)):
                    defaults[n] = eval(value, {"torch": torch})  # noqa: S307 - the README's own literals
        table[m.group(1)] = defaults
    return table


def signature(cls) -> dict:
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if k not in ("self", "params")}


def test_the_table_is_every_signature_with_its_defaults():
    table = vocabulary()
    assert len(table) >= 20
    for name, cls in OPTIMIZERS.items():
        sig = signature(cls)
        listed = {s: d[name] for s, d in table.items() if name in d}
        assert set(listed) == set(sig), f"{name}: README lists {sorted(set(listed) - set(sig))} it does not take " \
                                        f"and misses {sorted(set(sig) - set(listed))}"
        for setting, default in sig.items():
            got = tuple(default) if isinstance(default, (list, tuple)) else default
            assert got == listed[setting], f"{name}({setting}=...): the signature's default is {default!r}, " \
                                           f"the README says {listed[setting]!r}"
        for p in inspect.signature(cls.__init__).parameters.values():
            assert p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL), f"{name} hides settings behind **{p.name}"


# A value unlike the default, per setting (the defaults come from the signature).
OTHER = {
    "lr": lambda d, cls: 2 * d,
    "momentum": lambda d, cls: 0.5,
    "nesterov": lambda d, cls: not d,
    "weight_decay": lambda d, cls: d + 0.3,
    "msign": lambda d, cls: "svd" if d != "svd" else "polar_express",
    "ns_steps": lambda d, cls: 3,
    "msign_dtype": lambda d, cls: torch.bfloat16 if d is None else None,
    "ns_coefficients": lambda d, cls: (3.0, -3.2, 1.2),
    "eps": lambda d, cls: 100.0,  # above ||G||: Muon's floor on the normaliser shows
    "adjust_lr_fn": lambda d, cls: "match_rms_adamw",
    "manifold": lambda d, cls: {"ManifoldMuon": "dgram", "MACRO": "frobenius_sphere", "MuonH": "frobenius_sphere",
                                "SSO": {"name": "spectral_sphere", "r": 2.0},
                                "FSO": {"name": "frobenius_sphere", "r": 2.0}}[cls.__name__],
    "split": lambda d, cls: 2,
    "c": lambda d, cls: 2.0,
    "inner": lambda d, cls: "post",
    "tol": lambda d, cls: 0.5,
    "inner_steps": lambda d, cls: 2,
}
# ManifoldMuon's solver settings depend on the solver: tests/test_manifold_muon.py checks each against each
# solver (test_every_setting_acts_or_is_refused); here they are checked with the default solver only where
# it reads them.
SOLVER_ONLY = ("inner_steps", "tol", "warm_start", "alpha", "rho", "normalize", "msign", "ns_steps", "msign_dtype",
               "certify_first", "tracker")


def _steps(cls, **settings):
    torch.manual_seed(0)
    W = torch.nn.Parameter(torch.randn(8, 6) / 3)
    opt = cls([W], **settings)
    opt.retract_parameters() if hasattr(opt, "retract_parameters") else None
    G = torch.randn_like(W)
    for _ in range(3):
        W.grad = G + 0.3 * torch.randn_like(W)
        opt.step()
    return W.detach().clone()


CASES = [(name, s) for name, cls in OPTIMIZERS.items() for s in signature(cls)
         if not (name == "ManifoldMuon" and s in SOLVER_ONLY)]


@pytest.mark.parametrize("name,setting", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_every_setting_acts_or_is_refused(name, setting):
    cls = OPTIMIZERS[name]
    default = signature(cls)[setting]
    if setting == "nonfinite":  # acts on a non-finite gradient: raise leaves all as it was, skip steps the rest
        W, V = torch.nn.Parameter(torch.randn(8, 6) / 3), torch.nn.Parameter(torch.randn(8, 6) / 3)
        opt = cls([W, V], nonfinite="skip")
        before = V.detach().clone()
        W.grad, V.grad = torch.full_like(W, float("nan")), torch.randn_like(V)
        opt.step()
        assert not torch.equal(V, before) and torch.isfinite(W).all()
        with pytest.raises(FloatingPointError):
            W.grad = torch.full_like(W, float("nan"))
            cls([W, V])
            cls([W, V]).step()
        return
    value = OTHER[setting](default, cls)
    try:
        changed = _steps(cls, **{setting: value})
    except ValueError as e:  # refused: with a sentence that says what to do
        assert len(str(e)) > 40 and ("use" in str(e) or "leave" in str(e) or "choose" in str(e)), str(e)
        return
    assert not torch.equal(_steps(cls), changed), f"{name}({setting}={value!r}) did nothing"


def test_sso_fso_state_is_tensors_and_one_host_read_per_bisection_round():
    from manifold_muon.opcount import OpCounter

    W = torch.nn.Parameter(get_manifold("spectral_sphere").retract(torch.randn(8, 6)))
    opt = SSO([W], tol=1e-30, inner_steps=4)  # never within tol: all four rounds run
    W.grad = torch.randn_like(W)
    with OpCounter(big=48) as ops:
        opt.step()
    assert torch.is_tensor(opt.state[W]["lambda"]) and torch.is_tensor(opt.state[W]["h"])
    # each round's stopping test, and the step's one read (besides the checks inside torch's SVDs, opcount)
    assert ops.counts["sync"] - ops.counts["sync_checked"] == 4 + 1
