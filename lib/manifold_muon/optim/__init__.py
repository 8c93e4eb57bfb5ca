"""Optimizers: each a torch.optim.Optimizer whose param groups carry their manifold."""

__all__: list[str] = []

# Each module registers its public names here; a module not yet written is skipped.
for _mod in ("muon", "manifold_muon", "constrained"):
    try:
        _m = __import__(f"{__name__}.{_mod}", fromlist=["__all__"])
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_mod}":
            raise
        continue
    for _name in getattr(_m, "__all__", []):
        globals()[_name] = getattr(_m, _name)
        __all__.append(_name)
