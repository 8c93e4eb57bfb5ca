"""The seed study of the solver table's accuracy verdicts (``bench.solver_seeds``): its seed 0 is the table's own
measurement, its verdicts follow the criterion it states, and it refuses bad arguments before any work."""

import json

import pytest

from manifold_muon_book.bench import solver_seeds, solver_table


def test_seed_zero_reproduces_the_tables_settled_e_w():
    """The study measures what the table measures: at seed 0 its settled e_W and Muon's are the table row's."""
    rows = solver_seeds.measure((24, 8), "dgram", 0, ("lean",), steady=6)
    table = solver_table.measure((24, 8), "dgram", repeats=1, warmup=1, ref_max_n=768, steady=6, variants=("lean",),
                                 timing=dict(warmup=1, min_rounds=1, max_rounds=1, budget_s=0.0))
    (row,), (trow,) = rows, table
    assert row["e_W_steady_lr0.02"] == pytest.approx(trow["e_W_steady_lr0.02"], rel=1e-6)
    assert row["muon_e_W_steady_lr0.02"] == pytest.approx(trow["muon_e_W_steady_lr0.02"], rel=1e-6)
    assert row["met"] == (not any(m.startswith("e_W") for m in trow["misses"]))


def test_the_summary_follows_the_stated_criterion(tmp_path):
    result = solver_seeds.main(tmp_path, quick=True)
    on_disk = json.loads((tmp_path / "solver_seeds.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(result["summary"]))
    assert {r["manifold"] for r in result["summary"]} == set(solver_table.MANIFOLDS)
    for r in result["rows"]:
        assert r["bar"] == pytest.approx(min(0.01, 2 / 3 * r["muon_e_W_steady_lr0.02"]))
        assert r["met"] == (r["e_W_steady_lr0.02"] <= r["bar"])
    for s in result["summary"]:
        assert s["seeds"] == list(solver_seeds.QUICK["seeds"])
        assert s["holds"] == (len(set(s["met"])) == 1)
        assert s["times_met"] == sum(s["met"])
        assert s["e_W_min"] <= s["e_W_median"] <= s["e_W_max"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(variants=("lean", "nope")), "unknown variant"),
    (dict(manifolds=("sphere",)), "unknown manifold"),
    (dict(seeds=(0, 0)), "distinct"),
    (dict(seeds=(0, 5)), "tuning"),
    (dict(shapes=[(768, 768)], manifolds=("dgram",)), "certified reference"),
])
def test_bad_arguments_are_refused_before_any_work(tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        solver_seeds.main(tmp_path, **kwargs)
    assert not list(tmp_path.iterdir())


def test_merge_joins_parts_and_refuses_a_weight_measured_twice(tmp_path):
    solver_seeds.main(tmp_path, quick=True, manifolds=("stiefel",), name="a")
    solver_seeds.main(tmp_path, quick=True, manifolds=("dgram",), name="b")
    merged = solver_seeds.merge(tmp_path, ["a", "b"])
    assert [s["manifold"] for s in merged["summary"]] == ["stiefel", "dgram"]
    assert set(merged["parts"]) == {"a", "b"} and merged["parameters"]["merged"] == ["a", "b"]
    with pytest.raises(ValueError, match="merge only one"):
        solver_seeds.merge(tmp_path, ["a", "a"], name="c")
    assert not (tmp_path / "c.json").exists()


def test_skew_floors_reads_the_closed_forms_numerical_range(tmp_path):
    result = solver_seeds.skew_floors(tmp_path, shapes=((16, 16),), seeds=(0, 1), steady=4)
    assert [r["seed"] for r in result["rows"]] == [0, 1]
    for r in result["rows"]:
        assert 0 < r["s_min_rel"] <= 1 and r["below_range"] == 0  # a Gaussian-like S at n = 16 is well inside it
    with pytest.raises(ValueError, match="square shapes only"):
        solver_seeds.skew_floors(tmp_path, shapes=((16, 8),), name="bad")
    assert not (tmp_path / "bad.json").exists()
