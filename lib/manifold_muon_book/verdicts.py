"""How a chapter quotes a claim and states its verdict, kept consistent with ``book/claims.yml``.

``show_claim(id)`` renders the ledger's sentence for a claim as a quotation (its ``tex`` version, the same
words with the mathematics typeset, where the ledger has one); ``show_verdict(id, verdict, reason)`` renders
the verdict a chapter computed as an admonition and fails if the ledger records another status, so the
ledger and the chapters cannot drift apart (nbval re-executes every chapter in `make test`).

Both render MyST markdown, and the text they are given is prose, not markup: everything is shown as
written (``||J||_F``, ``z_(2)``, ``a * b`` keep their underscores and stars) except four kinds of markup
that pass through, so that a reason reads like the chapter around it:

* inline math ``$...$`` and display math ``$$...$$``;
* code spans in backticks;
* MyST roles, above all glued numbers: ``{glue:text}`name:.3f``` shows the number a cell glued with
  ``glue_value(name, x, ".3f")`` (write the reason as a plain or raw string, not an f-string, so that
  no number is formatted twice).

Each verdict admonition carries the HTML anchor ``verdict-<id>`` (lower case), which the claims page
links to; its class names the status, which the book's stylesheet colours.
"""

from __future__ import annotations

import re

from .claims import STATUSES, decide, load_ledger, source_of
from .pipeline import repo_root

__all__ = ["claim", "claim_markdown", "show_claim", "show_verdict", "escape_prose", "verdict_anchor",
           "verdict_markdown"]

# What passes through unescaped: display math, inline math, a MyST role with its argument, a code span.
_MARKUP = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$|\{[a-zA-Z][\w:-]*\}`[^`]+`|`[^`]+`", re.DOTALL)
_PUNCTUATION = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")

# The admonition style a status gets (the theme colours these), besides the class naming the status.
_STYLE = {
    "confirmed": "tip",
    "confirmed at small scale": "tip",
    "partly tested": "hint",
    "partly": "warning",
    "not reproduced at this scale": "caution",
    "refuted": "danger",
    "not testable here": "note",
    "pending": "note",
}


def _ledger() -> dict:
    return load_ledger(repo_root() / "book" / "claims.yml")


def claim(claim_id: str) -> dict:
    claims = {c["id"]: c for c in _ledger()["claims"]}
    if claim_id not in claims:
        raise KeyError(f"no claim {claim_id!r} in book/claims.yml; add it there first")
    return claims[claim_id]


def escape_prose(text: str) -> str:
    """``text`` as MyST markdown that shows it as written, except math, code spans and roles (see above).

    Whitespace runs (newlines included) become one space, so the result is one paragraph."""
    text = " ".join(str(text).split())
    out, end = [], 0
    for match in _MARKUP.finditer(text):
        out.append(_PUNCTUATION.sub(r"\\\1", text[end:match.start()]))
        out.append(match.group(0))
        end = match.end()
    out.append(_PUNCTUATION.sub(r"\\\1", text[end:]))
    return "".join(out)


def verdict_anchor(claim_id: str) -> str:
    """The HTML id of a claim's verdict admonition: ``verdict-b-sj-05`` for B-SJ-05."""
    return "verdict-" + re.sub(r"[^a-z0-9]+", "-", claim_id.lower()).strip("-")


def verdict_markdown(claim_id: str, verdict: str, reason: str, criterion: dict | None = None,
                     history: list | None = None, study: str | None = None) -> str:
    """The MyST admonition ``show_verdict`` displays (no ledger check: that is ``show_verdict``'s job); the
    ``study`` sentence (``power.study_text``: seeds, scale, spread, detectable effect) and a pre-registered
    ``criterion`` (with its ``history`` of changes) follow the reason."""
    status_class = "verdict-" + verdict.replace(" ", "-")
    extra = f"\n\n**Study:** {escape_prose(study)}" if study else ""
    if criterion is not None:
        rules = "; ".join(f"*{s}* if `{c}`" for s, c in criterion["decide"])
        extra += (f"\n\n**Criterion** (in book/claims.yml; written before the evidence existed, unless a change below says otherwise): {escape_prose(criterion['statistic'])} "
                 f"Scale: {escape_prose(criterion['scale'])}"
                 + (f"; {criterion['seeds']} seeds" if criterion["seeds"] else "") + f". Decision: {rules}.")
        for h in history or []:
            extra += (f"\n\n**Criterion changed** ({escape_prose(str(h['date']))}): from {escape_prose(str(h['old']))} "
                      f"to {escape_prose(str(h['new']))}. Why: {escape_prose(str(h['why']))}")
    return (f":::{{admonition}} Verdict on {claim_id}: {verdict}\n"
            f":class: {_STYLE[verdict]} verdict {status_class}\n"
            f":name: {verdict_anchor(claim_id)}\n\n"
            f"{escape_prose(reason)}{extra}\n:::")


def _markdown(text: str):
    from IPython.display import Markdown, display

    display(Markdown(text))


def claim_markdown(c: dict, source_kind: str) -> str:
    """The quotation ``show_claim`` displays: the ledger's ``tex`` sentence where there is one (its ``$...$``
    typeset), else its plain ``claim``; either shown as written otherwise (see the module doc)."""
    text = c.get("tex") or c["claim"]
    return f"> **Claim {c['id']}** ({source_kind}, *{escape_prose(c['section'])}*): {escape_prose(text)}"


def show_claim(claim_id: str) -> None:
    """Render the ledger's sentence for ``claim_id`` as a quotation (``claim_markdown``)."""
    ledger = _ledger()
    c = next((c for c in ledger["claims"] if c["id"] == claim_id), None)
    if c is None:
        raise KeyError(f"no claim {claim_id!r} in book/claims.yml; add it there first")
    _markdown(claim_markdown(c, source_of(c, ledger)["kind"]))


def show_verdict(claim_id: str, verdict: str | None = None, reason: str = "", evidence: dict | None = None,
                 study: str | None = None) -> None:
    """Render the verdict on ``claim_id`` as an admonition; fail unless the ledger records the same status.

    A claim with a pre-registered ``criterion`` in the ledger gets its status from it: pass the measured
    ``evidence`` (the names its rules use); ``verdict`` may then be left out, and if given must agree. The
    criterion and any change to it (``criterion_history``) are printed under the reason.

    ``reason`` is prose: it is shown as written, except ``$math$``, code spans and roles such as
    ``{glue:text}`name:fmt``` (see the module doc). ``study`` (``power.study_text``) states the seeds, scale,
    seed spread and smallest detectable effect of an experiment; a claim the ledger marks ``study: required``
    is refused without it."""
    c = claim(claim_id)
    if c.get("study") == "required" and not study:
        raise ValueError(f"{claim_id}: book/claims.yml asks for its study (seeds, scale, spread, detectable effect): "
                         "pass study=power.study_text(...) with the numbers glued by power.glue_study")
    if c.get("criterion") is not None:
        if evidence is None:
            raise ValueError(f"{claim_id} has a pre-registered criterion: pass evidence={{...}} with the names its "
                             f"rules use, so that the criterion, not the chapter, decides the status")
        decided = decide(c, evidence)
        if verdict is not None and verdict != decided:
            raise AssertionError(f"this chapter says {verdict!r} for {claim_id}, but its pre-registered criterion "
                                 f"gives {decided!r} for {evidence}")
        verdict = decided
    elif evidence is not None:
        raise ValueError(f"{claim_id} has no criterion in book/claims.yml, so evidence= decides nothing; register one")
    if verdict not in STATUSES:
        raise ValueError(f"verdict {verdict!r} is not one of {', '.join(STATUSES)}")
    if c["status"] != verdict:
        raise AssertionError(
            f"this chapter's check gives {verdict!r} for {claim_id}, but book/claims.yml says "
            f"{c['status']!r}: update the ledger (status and chapter) or the check"
        )
    _markdown(verdict_markdown(claim_id, verdict, reason, c.get("criterion"), c.get("criterion_history"), study))
