"""The benchmark square_cost (where square Stiefel's closed form spends its time): it writes a row per part and the
two derived rows, from medians that add up as documented, and refuses a shape it cannot time before any work."""

import pytest

from manifold_muon_book.bench import square_cost


def test_square_cost_writes_each_part_and_refuses_a_rectangle_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="square shapes"):
        square_cost.main(tmp_path, shapes=[(24, 12)])
    assert not list(tmp_path.iterdir())
    rows = square_cost.main(tmp_path, shapes=[(12, 12), (9, 9)], rounds=3)["rows"]
    assert (tmp_path / "square_cost.json").exists()
    for shape in ([12, 12], [9, 9]):
        ratio = {r["part"]: r["ratio"] for r in rows if r["shape"] == shape}
        assert list(ratio) == [*square_cost.PARTS, "elementwise", "floor"]
        assert all(ratio[p] > 0 for p in square_cost.PARTS)
        assert ratio["elementwise"] == pytest.approx(ratio["closed_form"] - ratio["eigh"] - ratio["products"])
        assert ratio["floor"] == pytest.approx(ratio["optimizer_step"] - ratio["elementwise"])
