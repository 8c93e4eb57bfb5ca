"""The claims ledger ``book/claims.yml``: the source documents, the chapter plan, and every checkable claim.

    ledger = load_ledger("book/claims.yml")   # {"sources": {...}, "chapters": [...], "claims": [...]}
    validate_ledger(ledger, root=".")          # raises ValueError naming the claim and the problem
    status_counts(ledger["claims"])            # {"pending": 120, "confirmed": 5, ...}, every status present

A claim starts ``pending`` with ``chapter: null``; once a chapter holds the evidence its status changes and
``chapter`` names that file. A claim's id starts with the key of its source (``B-``, ``P-``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

__all__ = ["FIELDS", "KINDS", "STATUSES", "load_ledger", "validate_ledger", "status_counts", "source_of"]

FIELDS = ("id", "section", "claim", "kind", "status", "chapter", "planned_chapter", "note")
REQUIRED = ("id", "section", "claim", "kind", "status", "chapter", "planned_chapter")
KINDS = ("symbolic", "numeric", "experiment")
STATUSES = ("pending", "confirmed", "confirmed at small scale", "partly", "not confirmed", "not testable here")
SOURCE_FIELDS = ("kind", "title", "authors", "year")


def load_ledger(path: str | Path = "book/claims.yml") -> dict:
    """Read the ledger; a missing file or a file of another shape is refused with what to fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no claims ledger at {path}: run from the repository root or pass its path")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader when libyaml is present
    ledger = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    if not isinstance(ledger, dict) or not {"sources", "chapters", "claims"} <= set(ledger):
        raise ValueError(f"{path} must be a YAML mapping with the keys sources, chapters and claims")
    return ledger


def source_of(claim: dict, ledger: dict) -> dict:
    """The source document of a claim (from its id's prefix)."""
    return ledger["sources"][claim["id"].split("-", 1)[0]]


def _check_one(claim: object, index: int, ledger: dict, root: Path) -> str:
    """Return the claim's id after checking its fields; raise ValueError naming it on the first problem."""
    if not isinstance(claim, dict):
        raise ValueError(f"entry {index} is a {type(claim).__name__}, not a mapping of the fields {FIELDS}")
    name = claim.get("id", f"entry {index}")
    missing = [f for f in REQUIRED if f not in claim]
    if missing:
        raise ValueError(f"claim {name}: missing field(s) {missing}; every claim needs {list(REQUIRED)}")
    unknown = [f for f in claim if f not in FIELDS]
    if unknown:
        raise ValueError(f"claim {name}: unknown field(s) {unknown}; allowed fields are {list(FIELDS)}")
    for field in ("id", "section", "claim"):
        if not isinstance(claim[field], str) or not claim[field].strip():
            raise ValueError(f"claim {name}: field '{field}' must be a non-empty string")
    prefix = name.split("-", 1)[0]
    if prefix not in ledger["sources"]:
        raise ValueError(f"claim {name}: an id starts with the key of its source, one of "
                         f"{', '.join(k + '-' for k in ledger['sources'])}")
    if claim["kind"] not in KINDS:
        raise ValueError(f"claim {name}: kind {claim['kind']!r} is not one of {list(KINDS)}")
    if claim["status"] not in STATUSES:
        raise ValueError(f"claim {name}: status {claim['status']!r} is not one of {list(STATUSES)}")
    if claim["planned_chapter"] not in ledger["chapters"]:
        raise ValueError(f"claim {name}: planned_chapter {claim['planned_chapter']!r} is not in the plan "
                         "(the chapters list of the ledger)")
    note = claim.get("note", "")
    if note is not None and not isinstance(note, str):
        raise ValueError(f"claim {name}: note must be a string (use \"\" for none)")
    chapter = claim["chapter"]
    if claim["status"] == "pending":
        if chapter is not None and not isinstance(chapter, str):
            raise ValueError(f"claim {name}: chapter must be a path string or null")
    elif not chapter:
        raise ValueError(f"claim {name}: status {claim['status']!r} needs 'chapter' to name the file holding the evidence")
    elif not (root / chapter).is_file():
        raise ValueError(f"claim {name}: chapter {chapter!r} does not exist under {root}; write it or fix the path")
    return name


def validate_ledger(ledger: dict, root: str | Path = ".") -> None:
    """Raise ValueError on the first problem: sources, plan, claim fields, duplicates, kind, status, chapter."""
    root = Path(root)
    for key, source in ledger["sources"].items():
        missing = [f for f in SOURCE_FIELDS if not source.get(f)]
        if missing:
            raise ValueError(f"source {key}: missing {missing}; every source needs {list(SOURCE_FIELDS)}")
    claims = ledger["claims"]
    if not isinstance(claims, list) or not claims:
        raise ValueError("the ledger's claims must be a non-empty list")
    seen: set[str] = set()
    for index, claim in enumerate(claims):
        name = _check_one(claim, index, ledger, root)
        if name in seen:
            raise ValueError(f"claim {name}: duplicate id; every id must be unique")
        seen.add(name)


def status_counts(claims: list[dict]) -> dict[str, int]:
    """Count claims per status, in the order of STATUSES, zeros included."""
    counts = Counter(c["status"] for c in claims)
    return {status: counts.get(status, 0) for status in STATUSES}
