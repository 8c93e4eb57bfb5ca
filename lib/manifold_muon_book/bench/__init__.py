"""Micro-benchmarks. Each module has ``main(out_dir: Path, quick: bool) -> dict`` and writes
``out_dir/<module>.json`` (with provenance). A benchmark measures and reports; it asserts nothing
about speed. Speed is always a ratio to a baseline measured in the same run."""

# solver_seeds and solver_settling before solver_table: the table fails the run when the lean step misses a target,
# after writing itself
BENCHMARKS = ("msign", "inner_solvers", "iteration_cap", "retractions", "optimizer_step", "training", "solver_seeds",
              "solver_settling", "solver_table")
