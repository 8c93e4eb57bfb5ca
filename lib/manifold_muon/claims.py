"""The claims ledger: load and check `book/claims.yml`, the list of every checkable claim in the two seeds.

Each claim is one mapping with the fields in ``FIELDS``. A claim starts ``pending`` with ``chapter: null``;
once a chapter holds the evidence its status changes and ``chapter`` names that file.

    claims = load_claims()                 # list of dicts
    validate_claims(claims, root=".")      # raises ValueError naming the claim and the problem
    status_counts(claims)                  # {"pending": 120, "confirmed": 5, ...}, every status present
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

FIELDS = ("id", "seed", "section", "claim", "kind", "status", "chapter", "planned_chapter", "note")
REQUIRED = ("id", "seed", "section", "claim", "kind", "status", "chapter", "planned_chapter")
KINDS = ("symbolic", "numeric", "experiment")
STATUSES = ("pending", "confirmed", "confirmed at small scale", "partly", "not confirmed", "not testable here")
SEEDS = {"B": "000_24d95f73fe89f2fb.txt", "P": "003_205683fa48c99f92.txt"}
CHAPTERS = (
    "chapters/01_muon_msign.md",
    "chapters/02_gram_manifolds.md",
    "chapters/03_dual_ascent.md",
    "chapters/04_retraction_absorbs_error.md",
    "chapters/05_five_assignments.md",
    "chapters/06_softmax_jacobian.md",
    "chapters/07_spectral_evidence.md",
    "chapters/08_assignment_problem.md",
    "chapters/09_macro.md",
    "chapters/10_activation_radii.md",
    "chapters/11_normalization_free.md",
    "chapters/12_weight_decay_rotation.md",
    "chapters/13_wedin.md",
    "chapters/14_benchmarks.md",
)


def load_claims(path: str | Path = "book/claims.yml") -> list[dict]:
    """Read the ledger; a missing file or a file that is not a YAML list is refused with what to fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no claims ledger at {path}: run from the repository root or pass its path")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader when libyaml is present
    claims = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    if not isinstance(claims, list):
        raise ValueError(f"{path} must hold a YAML list of claim mappings, found {type(claims).__name__}")
    return claims


def _check_one(claim: object, index: int, root: Path) -> str | None:
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
    for field in ("id", "seed", "section", "claim"):
        if not isinstance(claim[field], str) or not claim[field].strip():
            raise ValueError(f"claim {name}: field '{field}' must be a non-empty string")
    prefix = name.split("-", 1)[0]
    if prefix not in SEEDS:
        raise ValueError(f"claim {name}: id must start with B- (blog) or P- (paper)")
    if claim["seed"] != SEEDS[prefix]:
        raise ValueError(f"claim {name}: an id starting {prefix}- belongs to seed {SEEDS[prefix]}, not {claim['seed']}")
    if claim["kind"] not in KINDS:
        raise ValueError(f"claim {name}: kind {claim['kind']!r} is not one of {list(KINDS)}")
    if claim["status"] not in STATUSES:
        raise ValueError(f"claim {name}: status {claim['status']!r} is not one of {list(STATUSES)}")
    if claim["planned_chapter"] not in CHAPTERS:
        raise ValueError(f"claim {name}: planned_chapter {claim['planned_chapter']!r} is not in the plan {list(CHAPTERS)}")
    note = claim.get("note", "")
    if note is not None and not isinstance(note, str):
        raise ValueError(f"claim {name}: note must be a string (use \"\" for none)")
    chapter = claim["chapter"]
    if claim["status"] == "pending":
        if chapter is not None and not isinstance(chapter, str):
            raise ValueError(f"claim {name}: chapter must be a path string or null")
    else:
        if not chapter:
            raise ValueError(
                f"claim {name}: status {claim['status']!r} needs 'chapter' to name the file holding the evidence"
            )
        if not (root / chapter).is_file():
            raise ValueError(f"claim {name}: chapter {chapter!r} does not exist under {root}; write it or fix the path")
    return name


def validate_claims(claims: list[dict], root: str | Path = ".") -> None:
    """Raise ValueError on the first malformed claim: fields, duplicates, kind, status, chapter, plan."""
    root = Path(root)
    if not isinstance(claims, list) or not claims:
        raise ValueError("the ledger must be a non-empty list of claims")
    seen: set[str] = set()
    for index, claim in enumerate(claims):
        name = _check_one(claim, index, root)
        if name in seen:
            raise ValueError(f"claim {name}: duplicate id; every id must be unique")
        seen.add(name)


def status_counts(claims: list[dict]) -> dict[str, int]:
    """Count claims per status, in the order of STATUSES, zeros included."""
    counts = Counter(c["status"] for c in claims)
    return {status: counts.get(status, 0) for status in STATUSES}
