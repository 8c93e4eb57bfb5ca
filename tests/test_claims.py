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


# ---------------------------------------------------------------- pre-registered criteria

from manifold_muon_book.claims import LOCK, check_criteria_lock, decide, lock_criteria  # noqa: E402


def _criterion(**overrides):
    base = {"statistic": "d = the mean difference", "scale": "cpu", "seeds": 3,
            "decide": [["confirmed at small scale", "d <= 0.1"], ["partly", "True"]]}
    base.update(overrides)
    return base


def test_every_criterion_of_the_ledger_is_locked_and_unchanged(ledger):
    import json

    lock = json.loads((ROOT / LOCK).read_text())
    assert check_criteria_lock(ledger, lock) == []
    assert any(c.get("criterion") for c in ledger["claims"])


def test_a_criterion_changed_without_history_is_refused(ledger):
    claim = _claim(status="partly", chapter="chapters/01_muon_msign.md", kind="experiment", criterion=_criterion())
    before = _ledger(ledger, claim)
    lock = lock_criteria(before, {})
    assert check_criteria_lock(before, lock) == []
    changed = copy.deepcopy(before)
    changed["claims"][0]["criterion"]["decide"][0][1] = "d <= 0.2"  # the bar moved after the data
    problems = check_criteria_lock(changed, lock)
    assert len(problems) == 1 and "criterion_history" in problems[0]
    with pytest.raises(ValueError, match="changed after it was locked"):
        lock_criteria(changed, lock)
    changed["claims"][0]["criterion_history"] = [{"date": "2026-12-02", "old": "d <= 0.1", "new": "d <= 0.2",
                                                  "why": "a reason a reader can judge"}]
    assert check_criteria_lock(changed, lock) == []
    assert check_criteria_lock(changed, lock_criteria(changed, lock)) == []
    assert check_criteria_lock(_ledger(ledger, claim), {}) != []  # a criterion never locked


def test_the_criterion_decides_and_names_what_it_needs():
    claim = _claim(criterion=_criterion())
    assert decide(claim, {"d": 0.05}) == "confirmed at small scale"
    assert decide(claim, {"d": 0.5}) == "partly"
    with pytest.raises(ValueError, match="needs 'd'"):
        decide(claim, {"e": 1})


@pytest.mark.parametrize("bad, message", [
    ({"decide": [["proven", "True"]]}, "not a verdict status"),
    ({"decide": [["partly", "d <="]]}, "invalid syntax|SyntaxError|expected"),
    ({"seeds": "three"}, "seeds an int"),
])
def test_a_malformed_criterion_is_refused(tmp_path, ledger, bad, message):
    claim = _claim(criterion=_criterion(**bad))
    with pytest.raises((ValueError, SyntaxError), match=message):
        validate_ledger(_ledger(ledger, claim), tmp_path)


def test_the_chapter_plan_is_the_chapters_that_exist(ledger):
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("[0-9][0-9]_*.md"))
    assert sorted(ledger["chapters"]) == files, "book/claims.yml's chapters list must name exactly the chapter files"


# ---------------------------------------------------------------- the TeX version of a claim

import re  # noqa: E402

from manifold_muon_book.claims import criterion_sha, tex_problem  # noqa: E402


def test_tex_is_optional_and_its_dollars_pair_up(tmp_path, ledger):
    validate_ledger(_ledger(ledger, _claim()), tmp_path)  # no tex: fine
    validate_ledger(_ledger(ledger, _claim(tex=r"$\operatorname{msign}$ snaps every singular value to $1$.")),
                    tmp_path)
    for bad, message in [("", "non-empty string"), ("   ", "non-empty string"), (None, "non-empty string"),
                         (3, "non-empty string"), (r"$\|W\|_2 = 1", r"odd number of '\$'"),
                         (r"$a$ and $b", "odd number"), ("$$x$$ displayed", r"'\$\$'"), ("an empty $ $ one", "empty")]:
        with pytest.raises(ValueError, match="B-XX-01: tex .*" + message):
            validate_ledger(_ledger(ledger, _claim(tex=bad)), tmp_path)
    assert tex_problem(r"At $n = 64$, $\alpha = 0.01$.") is None


def test_every_claim_with_ascii_mathematics_has_a_tex_version(ledger):
    """A claim written with ``||W||_2`` or ``W in R^{m x n}`` is shown to readers typeset, from its tex field."""
    ascii_math = re.compile(r"\|\||\bin R\^|\^T\b|sqrt\(|<=|>=")
    missing = [c["id"] for c in ledger["claims"] if ascii_math.search(c["claim"]) and not c.get("tex")]
    assert not missing, f"claims with ASCII mathematics and no tex field: {missing}"
    assert sum("tex" in c for c in ledger["claims"]) >= 40


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{2,}", text)


def test_a_tex_version_keeps_the_claims_words(ledger):
    """Only the notation changes: the words of ``tex`` outside its formulas are the claim's words, in order."""
    for c in ledger["claims"]:
        if not c.get("tex"):
            continue
        assert tex_problem(c["tex"]) is None, (c["id"], tex_problem(c["tex"]))
        words, claim_words = _words(re.sub(r"\$[^$]*\$", " ", c["tex"])), _words(c["claim"])
        at = 0
        for word in words:
            assert word in claim_words[at:], f"{c['id']}: tex says {word!r} where the claim does not"
            at = claim_words.index(word, at) + 1


def test_a_tex_version_is_no_criterion_change(ledger):
    """Adding or editing ``tex`` leaves a locked criterion locked: the lock hashes the criterion alone."""
    claim = _claim(status="partly", chapter="chapters/01_muon_msign.md", kind="experiment", criterion=_criterion())
    before = _ledger(ledger, claim)
    lock = lock_criteria(before, {})
    after = copy.deepcopy(before)
    after["claims"][0]["tex"] = r"$\operatorname{msign}$ snaps every singular value to $1$."
    assert check_criteria_lock(after, lock) == []
    assert criterion_sha(after["claims"][0]["criterion"]) == lock["B-XX-01"]["sha"]
