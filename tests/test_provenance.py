"""Run records and atomic writes: what produced a result is recorded, and a failed write loses nothing."""

import json

import pytest

from manifold_muon_lab.provenance import provenance, summary, write_json_atomic, write_text_atomic


def test_provenance_records_what_produced_a_result():
    rec = provenance(parameters={"seed": 3}, wall_time_s=1.23456)
    for key in ("commit", "lib_version", "torch_version", "python_version", "hardware", "created_utc"):
        assert rec[key]
    assert rec["parameters"] == {"seed": 3} and rec["wall_time_s"] == 1.235
    line = summary(rec, "run x")
    assert line.startswith("run x: commit ") and "seed 3" in line and "wall 1 s" in line


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "m.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # not serialisable: fails before anything is written
    assert json.loads(path.read_text()) == {"a": 1}

    with pytest.raises(TypeError):
        write_text_atomic(path, 12345)  # the write itself fails half-way
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
