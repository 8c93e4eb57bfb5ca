"""The settling study of the solver table's e_W (``bench.solver_settling``): its first checkpoint is the table's
(and the seed study's) measurement, its classes follow the criterion it states, and it refuses bad arguments
before any work."""

import json

import pytest

from manifold_muon_book.bench import solver_seeds, solver_settling


def test_first_checkpoint_is_the_seed_studys_measurement():
    """Reading the stream at several checkpoints does not change what is read at the first: the seed study's
    (and so the table's) settled e_W on the same draw, and Muon's."""
    rows = solver_settling.measure((24, 8), "dgram", 1, ("lean",), checkpoints=(6, 9, 10))
    (seed_row,) = solver_seeds.measure((24, 8), "dgram", 1, ("lean",), steady=6)
    first = next(r for r in rows if r["steps"] == 6)
    assert first["e_W"] == pytest.approx(seed_row["e_W_steady_lr0.02"], rel=1e-6)
    assert first["muon_e_W"] == pytest.approx(seed_row["muon_e_W_steady_lr0.02"], rel=1e-6)
    assert first["bar"] == pytest.approx(seed_row["bar"]) and first["met"] == seed_row["met"]
    assert [r["steps"] for r in rows] == [6, 9, 10]


@pytest.mark.parametrize("met, verdict", [
    ([True, True, True], "settled"), ([False, True, False, False], "settled"),
    ([False, False, True, True], "transient"), ([True, True, False, False], "transient"),
    ([False, True, True, False], "unsettled"), ([True, True, False], "unsettled"),
])
def test_classes_follow_the_stated_criterion(met, verdict):
    assert solver_settling.classify(met) == verdict


def test_the_summary_follows_the_stated_criterion(tmp_path):
    result = solver_settling.main(tmp_path, quick=True)
    on_disk = json.loads((tmp_path / "solver_settling.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(result["summary"]))
    for r in result["rows"]:
        assert r["bar"] == pytest.approx(min(0.01, 2 / 3 * r["muon_e_W"]))
        assert r["met"] == (r["e_W"] <= r["bar"])
    for s in result["summary"]:
        assert s["checkpoints"] == list(solver_settling.QUICK["checkpoints"])
        assert s["verdict"] == solver_settling.classify(s["met"])
        assert s["to_bar"] == pytest.approx([e / r["bar"] for e, r in zip(s["e_W"], [
            r for r in result["rows"] if (r["manifold"], r["variant"], r["seed"]) == (s["manifold"], s["variant"], s["seed"])])])
    for v, c in result["counts"].items():
        assert c["settled"] + c["transient"] + c["unsettled"] == sum(s["variant"] == v for s in result["summary"])


def test_a_stateless_step_reads_the_same_at_every_checkpoint_given_the_same_momentum():
    """The cold step carries nothing: stepping it at a checkpoint is stepping it alone on that momentum (the
    control the study's docstring describes)."""
    import torch

    from manifold_muon.optim import ManifoldMuon
    from manifold_muon_book.bench.solver_table import VARIANTS, start_point, steady_stream

    W0 = start_point((24, 8), "stiefel", 0)
    grads = steady_stream((24, 8), 8, 2)
    make = lambda p: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold="stiefel", **VARIANTS["lean_cold"])  # noqa: E731
    stepped = solver_settling.walk_checkpoints(make, W0, grads, (3, 5, 8), 0.02)
    for c, (W_new, _) in stepped.items():
        alone = solver_settling.walk_checkpoints(make, W0, grads[c - 1:c], (1, 2, 3), 0.02)[1][0]
        assert torch.equal(W_new, alone)


@pytest.mark.parametrize("kwargs, words", [
    (dict(variants=("lean", "nope")), "unknown variant"),
    (dict(manifolds=("sphere",)), "unknown manifold"),
    (dict(seeds=(1, 1)), "distinct"),
    (dict(checkpoints=(64, 128)), "at least three"),
    (dict(checkpoints=(64, 64, 128)), "increasing"),
    (dict(checkpoints=(128, 64, 256)), "increasing"),
    (dict(shapes=[(768, 768)], manifolds=("dgram",)), "certified reference"),
])
def test_bad_arguments_are_refused_before_any_work(tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        solver_settling.main(tmp_path, **kwargs)
    assert not list(tmp_path.iterdir())


def test_merge_joins_parts_and_refuses_duplicates_and_other_checkpoints(tmp_path):
    solver_settling.main(tmp_path, quick=True, manifolds=("stiefel",), name="a")
    solver_settling.main(tmp_path, quick=True, manifolds=("dgram",), name="b")
    merged = solver_settling.merge(tmp_path, ["a", "b"])
    assert [s["manifold"] for s in merged["summary"]] == ["stiefel", "stiefel", "dgram", "dgram"]
    assert sum(merged["counts"]["lean"][c] for c in ("settled", "transient", "unsettled")) == 2
    with pytest.raises(ValueError, match="merge only one"):
        solver_settling.merge(tmp_path, ["a", "a"], name="c")
    data = json.loads((tmp_path / "b.json").read_text())
    data["parameters"]["checkpoints"] = [3, 5, 7]
    (tmp_path / "d.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="different checkpoints"):
        solver_settling.merge(tmp_path, ["a", "d"], name="c")
    assert not (tmp_path / "c.json").exists()


def test_an_interrupted_study_resumes_where_it_stopped(tmp_path, monkeypatch):
    """Each (weight, draw) is kept as it is measured: a second run measures only what is missing, writes the study
    an uninterrupted run writes, and removes the partial file; a partial file of other settings is refused."""
    real, calls = solver_settling.measure, []

    def interrupted(shape, manifold, *args):
        if manifold == "dgram":
            raise KeyboardInterrupt
        return real(shape, manifold, *args)

    monkeypatch.setattr(solver_settling, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        solver_settling.main(tmp_path, quick=True)
    partial = tmp_path / "solver_settling.partial.json"
    assert partial.exists() and not (tmp_path / "solver_settling.json").exists()
    with pytest.raises(ValueError, match="other settings"):
        solver_settling.main(tmp_path, quick=True, variants=("lean",))
    assert partial.exists()
    monkeypatch.setattr(solver_settling, "measure", lambda shape, manifold, *a: calls.append(manifold) or real(shape, manifold, *a))
    resumed = solver_settling.main(tmp_path, quick=True)
    assert calls == ["dgram", "gram_oblique"] and not partial.exists()
    fresh = solver_settling.main(tmp_path / "fresh", quick=True)
    assert resumed["summary"] == fresh["summary"]
