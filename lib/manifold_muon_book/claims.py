r"""The claims ledger ``book/claims.yml``: the source documents, the chapter plan, and every checkable claim.

    ledger = load_ledger("book/claims.yml")   # {"sources": {...}, "chapters": [...], "claims": [...]}
    validate_ledger(ledger, root=".")          # raises ValueError naming the claim and the problem
    status_counts(ledger["claims"])            # {"pending": 120, "confirmed": 5, ...}, every status present

A claim starts ``pending`` with ``chapter: null``; once a chapter holds the evidence its status changes and
``chapter`` names that file. A claim's id starts with the key of its source (``B-``, ``P-``).

``claim`` is the sentence in plain text (ASCII notation: ``||W||_2``, ``W^T W``); a claim with mathematics in
it also has ``tex``, the same sentence, the same words, with its mathematics as inline TeX (``$\|W\|_2$``,
``$W^\top W$``). ``show_claim`` and the claims page show ``tex`` where there is one. It is presentation only:
no check reads it, and a criterion's lock (``criterion_sha``) does not cover it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

__all__ = ["FIELDS", "KINDS", "STATUSES", "load_ledger", "validate_ledger", "status_counts", "source_of",
           "criterion_sha", "decide", "check_criteria_lock", "lock_criteria", "LOCK", "tex_problem"]

FIELDS = ("id", "section", "claim", "tex", "kind", "status", "chapter", "planned_chapter", "note", "criterion",
          "criterion_history", "study")
REQUIRED = ("id", "section", "claim", "kind", "status", "chapter", "planned_chapter")
KINDS = ("symbolic", "numeric", "experiment")
STATUSES = ("pending", "confirmed", "confirmed at small scale", "partly tested", "partly", "not reproduced at this scale",
            "refuted", "not testable here")
# What each status means (the book's legend, book/how_to_read.md, says the same in a table):
#   confirmed                    the claim holds as stated
#   confirmed at small scale     an experiment agrees at the scale this book ran, not at the source's
#   partly tested                what was tested holds; the verdict names the part that was not tested
#   partly                       a part of the claim fails; the verdict names it and shows why
#   not reproduced at this scale the effect was not seen at this book's scale (the verdict gives the scale
#                                and the smallest effect the study could have detected); not a refutation
#   refuted                      a counterexample or a proof shows the claim false as stated
#   not testable here            needs what this book does not have (the verdict names the command and preset)
SOURCE_FIELDS = ("kind", "title", "authors", "year")
# A pre-registered criterion: what is measured, on what, and which status each outcome gives. ``decide`` is
# a list of [status, condition] pairs, tried in order; a condition is a Python expression over the evidence
# a chapter passes to ``show_verdict`` (names, numbers, comparisons, and/or/not, min/max/abs/all/any).
CRITERION_FIELDS = ("statistic", "seeds", "scale", "decide")
HISTORY_FIELDS = ("date", "old", "new", "why")
LOCK = "book/criteria.lock.json"


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
    if "tex" in claim:
        _check_tex(claim["tex"], name)
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
    if claim.get("study", "required") != "required":
        raise ValueError(f"claim {name}: study may only be 'required' (its verdict must state seeds, scale, seed "
                         "spread and detectable effect); leave the field out otherwise")
    _check_criterion(claim, name)
    return name


def tex_problem(text: object) -> str | None:
    """What is wrong with a ``tex`` field (None when nothing is): a non-empty string whose ``$`` come in pairs,
    each pair a non-empty inline formula, with no display math ``$$`` (every ``$`` delimits math: the ledger's
    sentences name no sums of money)."""
    if not isinstance(text, str) or not text.strip():
        return "must be a non-empty string (leave the field out when the claim has no mathematics)"
    if "$$" in text:
        return "holds '$$': a claim's sentence takes inline math only ($...$)"
    if text.count("$") % 2:
        return f"has an odd number of '$' ({text.count('$')}): every $ that opens math needs one that closes it"
    if any(not part.strip() for part in text.split("$")[1::2]):
        return "holds an empty formula ('$ $')"
    return None


def _check_tex(text: object, name: str) -> None:
    problem = tex_problem(text)
    if problem:
        raise ValueError(f"claim {name}: tex {problem}")


def _check_criterion(claim: dict, name: str) -> None:
    crit, history = claim.get("criterion"), claim.get("criterion_history")
    if crit is None:
        if history:
            raise ValueError(f"claim {name}: criterion_history without a criterion")
        return
    if not isinstance(crit, dict) or set(crit) != set(CRITERION_FIELDS):
        raise ValueError(f"claim {name}: criterion must be a mapping of exactly {list(CRITERION_FIELDS)}")
    if not (isinstance(crit["statistic"], str) and isinstance(crit["scale"], str)
            and (crit["seeds"] is None or isinstance(crit["seeds"], int))):
        raise ValueError(f"claim {name}: criterion statistic and scale are strings, seeds an int (or null)")
    rules = crit["decide"]
    if not (isinstance(rules, list) and rules and all(isinstance(r, list) and len(r) == 2 for r in rules)):
        raise ValueError(f"claim {name}: criterion decide is a list of [status, condition] pairs")
    for status, condition in rules:
        if status not in STATUSES or status == "pending":
            raise ValueError(f"claim {name}: criterion decide gives {status!r}, not a verdict status")
        compile(str(condition), f"{name} criterion", "eval")  # a SyntaxError names the claim
    for entry in history or []:
        if not (isinstance(entry, dict) and set(entry) == set(HISTORY_FIELDS)):
            raise ValueError(f"claim {name}: each criterion_history entry has exactly {list(HISTORY_FIELDS)}")


_SAFE = {"min": min, "max": max, "abs": abs, "all": all, "any": any, "len": len, "True": True, "False": False}


def decide(claim: dict, evidence: dict) -> str:
    """The status a claim's pre-registered criterion gives for ``evidence`` (the first rule that holds)."""
    crit = claim.get("criterion")
    if crit is None:
        raise ValueError(f"claim {claim['id']} has no criterion in book/claims.yml to decide by")
    for status, condition in crit["decide"]:
        try:
            if eval(str(condition), {"__builtins__": {}}, {**_SAFE, **evidence}):  # noqa: S307 - the ledger's own rules
                return status
        except NameError as e:
            raise ValueError(f"claim {claim['id']}: its criterion needs {e.name!r}; pass it in evidence=") from e
    raise ValueError(f"claim {claim['id']}: no rule of its criterion holds for {evidence}; the last rule should be "
                     "a catch-all ['<status>', 'True']")


def criterion_sha(criterion: dict) -> str:
    """A hash of a criterion's content (key order and YAML layout aside)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(criterion, sort_keys=True).encode()).hexdigest()[:16]


def _lock_entry(claim: dict) -> dict:
    return {"sha": criterion_sha(claim["criterion"]), "history": len(claim.get("criterion_history") or [])}


def _changed_without_history(claim: dict, entry: dict) -> bool:
    """Whether a locked criterion changed and no criterion_history entry was added since it was locked."""
    return (entry["sha"] != criterion_sha(claim["criterion"])
            and not len(claim.get("criterion_history") or []) > entry["history"])


def check_criteria_lock(ledger: dict, lock: dict) -> list[str]:
    """The problems of the ledger against the lock (``book/criteria.lock.json``, written by ``lock``): a
    criterion that is not locked, or that changed since it was locked without a new criterion_history entry.
    An empty list: all is well."""
    problems = []
    for c in ledger["claims"]:
        if c.get("criterion") is None:
            continue
        entry = lock.get(c["id"])
        if entry is None:
            problems.append(f"{c['id']}: its criterion is not locked; run `python -m manifold_muon_book.claims lock` "
                            "before the evidence exists")
        elif _changed_without_history(c, entry):
            problems.append(f"{c['id']}: its criterion changed after it was locked; add a criterion_history entry "
                            "(date, old, new, why) saying what changed and why, then lock again")
    return problems


def lock_criteria(ledger: dict, lock: dict) -> dict:
    """The lock with every criterion recorded; refuses (ValueError) a criterion that changed without a history
    entry, so a criterion cannot be re-locked silently."""
    bad = [c["id"] for c in ledger["claims"]
           if c.get("criterion") is not None and c["id"] in lock and _changed_without_history(c, lock[c["id"]])]
    if bad:
        raise ValueError(f"the criterion of {', '.join(bad)} changed after it was locked; add a criterion_history "
                         "entry (date, old, new, why) saying what changed and why, then lock again")
    return {**lock, **{c["id"]: _lock_entry(c) for c in ledger["claims"] if c.get("criterion") is not None}}


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


def main(argv=None) -> int:
    """``python -m manifold_muon_book.claims lock``: record every criterion in book/criteria.lock.json
    (refused where one changed without a criterion_history entry); ``check``: print the problems."""
    import argparse
    import json

    from .pipeline import repo_root

    parser = argparse.ArgumentParser(prog="python -m manifold_muon_book.claims", description=main.__doc__)
    parser.add_argument("command", choices=("lock", "check"))
    args = parser.parse_args(argv)
    root = repo_root()
    ledger = load_ledger(root / "book" / "claims.yml")
    validate_ledger(ledger, root)
    path = root / LOCK
    lock = json.loads(path.read_text()) if path.is_file() else {}
    if args.command == "check":
        problems = check_criteria_lock(ledger, lock)
        print("\n".join(problems) or f"every criterion is locked ({LOCK})")
        return 1 if problems else 0
    try:
        new = lock_criteria(ledger, lock)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(new.items())), indent=1) + "\n")
    tmp.replace(path)
    print(f"locked {len(new)} criteria in {LOCK}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
