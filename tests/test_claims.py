"""The claims ledger loads, validates, and its validator refuses the mistakes it is there to catch."""

import copy
from pathlib import Path

import pytest
import yaml

from manifold_muon.claims import CHAPTERS, KINDS, SEEDS, STATUSES, load_claims, status_counts, validate_claims

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "book" / "claims.yml"


@pytest.fixture(scope="module")
def claims():
    return load_claims(LEDGER)


def _claim(**overrides):
    base = {
        "id": "B-XX-01",
        "seed": SEEDS["B"],
        "section": "Background",
        "claim": "msign snaps every singular value to 1.",
        "kind": "numeric",
        "status": "pending",
        "chapter": None,
        "planned_chapter": CHAPTERS[0],
        "note": "",
    }
    base.update(overrides)
    return base


def test_real_ledger_validates(claims):
    validate_claims(claims, ROOT)
    assert len(claims) >= 40
    assert {c["seed"] for c in claims} == set(SEEDS.values())
    assert all(c["kind"] in KINDS for c in claims)


def test_each_seed_has_many_claims(claims):
    per_seed = {seed: sum(c["seed"] == seed for c in claims) for seed in SEEDS.values()}
    assert min(per_seed.values()) >= 20, per_seed


def test_status_counts_cover_every_status_and_sum(claims):
    counts = status_counts(claims)
    assert tuple(counts) == STATUSES
    assert sum(counts.values()) == len(claims)
    mixed = [_claim(id="B-XX-01"), _claim(id="B-XX-02", status="partly", chapter="x.md")]
    assert status_counts(mixed) == {s: (1 if s in ("pending", "partly") else 0) for s in STATUSES}


def test_confirmed_claim_needs_an_existing_chapter(tmp_path):
    claim = _claim(status="confirmed", chapter="chapters/01_muon_msign.md")
    with pytest.raises(ValueError, match="B-XX-01.*does not exist"):
        validate_claims([claim], tmp_path)
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "01_muon_msign.md").write_text("# msign\n")
    validate_claims([claim], tmp_path)
    with pytest.raises(ValueError, match="B-XX-01.*needs 'chapter'"):
        validate_claims([_claim(status="partly", chapter=None)], tmp_path)


def test_duplicate_ids_fail(tmp_path):
    with pytest.raises(ValueError, match="B-XX-01: duplicate id"):
        validate_claims([_claim(), _claim(claim="another statement")], tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"status": "proven"}, "status 'proven'"),
        ({"kind": "vibes"}, "kind 'vibes'"),
        ({"planned_chapter": "chapters/99_elsewhere.md"}, "not in the plan"),
        ({"seed": SEEDS["P"]}, "belongs to seed"),
        ({"id": "X-XX-01"}, "must start with B- .* or P-"),
        ({"extra": 1}, "unknown field"),
    ],
)
def test_bad_fields_fail(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_claims([_claim(**overrides)], tmp_path)


def test_missing_field_fails(tmp_path):
    claim = _claim()
    del claim["kind"]
    with pytest.raises(ValueError, match="B-XX-01: missing field"):
        validate_claims([claim], tmp_path)


def test_load_round_trips_a_written_ledger(tmp_path, claims):
    path = tmp_path / "claims.yml"
    path.write_text(yaml.safe_dump(claims[:3], sort_keys=False))
    assert load_claims(path) == copy.deepcopy(claims[:3])
    path.write_text("id: not-a-list\n")
    with pytest.raises(ValueError, match="YAML list"):
        load_claims(path)
