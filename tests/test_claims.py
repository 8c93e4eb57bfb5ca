"""The claims ledger loads, validates, and its validator refuses the mistakes it is there to catch."""

import copy
from pathlib import Path

import pytest
import yaml

from manifold_muon_book.claims import KINDS, STATUSES, load_ledger, status_counts, validate_ledger

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "book" / "claims.yml"


@pytest.fixture(scope="module")
def ledger():
    return load_ledger(LEDGER)


def _ledger(ledger, *claims):
    return {"sources": copy.deepcopy(ledger["sources"]), "chapters": list(ledger["chapters"]), "claims": list(claims)}


def _claim(**overrides):
    base = {
        "id": "B-XX-01",
        "section": "Background",
        "claim": "msign snaps every singular value to 1.",
        "kind": "numeric",
        "status": "pending",
        "chapter": None,
        "planned_chapter": "chapters/01_muon_msign.md",
        "note": "",
    }
    base.update(overrides)
    return base


def test_real_ledger_validates(ledger):
    validate_ledger(ledger, ROOT)
    claims = ledger["claims"]
    assert len(claims) >= 40
    assert {c["id"].split("-")[0] for c in claims} == set(ledger["sources"]) == {"B", "P"}
    assert all(c["kind"] in KINDS for c in claims)


def test_each_source_has_many_claims(ledger):
    per_source = {key: sum(c["id"].startswith(key + "-") for c in ledger["claims"]) for key in ledger["sources"]}
    assert min(per_source.values()) >= 20, per_source


def test_status_counts_cover_every_status_and_sum(ledger):
    counts = status_counts(ledger["claims"])
    assert tuple(counts) == STATUSES
    assert sum(counts.values()) == len(ledger["claims"])
    mixed = [_claim(id="B-XX-01"), _claim(id="B-XX-02", status="partly", chapter="x.md")]
    assert status_counts(mixed) == {s: (1 if s in ("pending", "partly") else 0) for s in STATUSES}


def test_confirmed_claim_needs_an_existing_chapter(tmp_path, ledger):
    claim = _claim(status="confirmed", chapter="chapters/01_muon_msign.md")
    with pytest.raises(ValueError, match="B-XX-01.*does not exist"):
        validate_ledger(_ledger(ledger, claim), tmp_path)
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "01_muon_msign.md").write_text("# msign\n")
    validate_ledger(_ledger(ledger, claim), tmp_path)
    with pytest.raises(ValueError, match="B-XX-01.*needs 'chapter'"):
        validate_ledger(_ledger(ledger, _claim(status="partly", chapter=None)), tmp_path)


def test_duplicate_ids_fail(tmp_path, ledger):
    with pytest.raises(ValueError, match="B-XX-01: duplicate id"):
        validate_ledger(_ledger(ledger, _claim(), _claim(claim="another statement")), tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"status": "proven"}, "status 'proven'"),
        ({"kind": "vibes"}, "kind 'vibes'"),
        ({"planned_chapter": "chapters/99_elsewhere.md"}, "not in the plan"),
        ({"id": "X-XX-01"}, "starts with the key of its source, one of B-, P-"),
        ({"extra": 1}, "unknown field"),
        ({"seed": "000_24d95f73fe89f2fb.txt"}, "unknown field"),
    ],
)
def test_bad_fields_fail(tmp_path, ledger, overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_ledger(_ledger(ledger, _claim(**overrides)), tmp_path)


def test_missing_field_fails(tmp_path, ledger):
    claim = _claim()
    del claim["kind"]
    with pytest.raises(ValueError, match="B-XX-01: missing field"):
        validate_ledger(_ledger(ledger, claim), tmp_path)


def test_a_source_without_its_title_fails(tmp_path, ledger):
    bad = _ledger(ledger, _claim())
    del bad["sources"]["B"]["title"]
    with pytest.raises(ValueError, match=r"source B: missing \['title'\]"):
        validate_ledger(bad, tmp_path)


def test_load_round_trips_a_written_ledger(tmp_path, ledger):
    path = tmp_path / "claims.yml"
    small = _ledger(ledger, *ledger["claims"][:3])
    path.write_text(yaml.safe_dump(small, sort_keys=False))
    assert load_ledger(path) == small
    path.write_text("- id: a list, not the ledger's mapping\n")
    with pytest.raises(ValueError, match="sources, chapters and claims"):
        load_ledger(path)
