"""How a chapter quotes a claim and states its verdict, kept consistent with ``book/claims.yml``.

``show_claim(id)`` renders the ledger's sentence for a claim; ``show_verdict(id, verdict, reason)``
renders the verdict a chapter computed and fails if the ledger records another status, so the
ledger and the chapters cannot drift apart (nbval re-executes every chapter in `make test`).
"""

from __future__ import annotations

from .claims import STATUSES, load_ledger, source_of
from .pipeline import repo_root

__all__ = ["claim", "show_claim", "show_verdict"]


def _ledger() -> dict:
    return load_ledger(repo_root() / "book" / "claims.yml")


def claim(claim_id: str) -> dict:
    claims = {c["id"]: c for c in _ledger()["claims"]}
    if claim_id not in claims:
        raise KeyError(f"no claim {claim_id!r} in book/claims.yml; add it there first")
    return claims[claim_id]


def _markdown(text: str):
    from IPython.display import Markdown, display

    display(Markdown(text))


def show_claim(claim_id: str) -> None:
    """Render the ledger's sentence for ``claim_id`` as a quotation."""
    ledger = _ledger()
    c = next((c for c in ledger["claims"] if c["id"] == claim_id), None)
    if c is None:
        raise KeyError(f"no claim {claim_id!r} in book/claims.yml; add it there first")
    _markdown(f"> **Claim {c['id']}** ({source_of(c, ledger)['kind']}, *{c['section']}*): {c['claim']}")


def show_verdict(claim_id: str, verdict: str, reason: str) -> None:
    if verdict not in STATUSES:
        raise ValueError(f"verdict {verdict!r} is not one of {', '.join(STATUSES)}")
    c = claim(claim_id)
    if c["status"] != verdict:
        raise AssertionError(
            f"this chapter's check gives {verdict!r} for {claim_id}, but book/claims.yml says "
            f"{c['status']!r}: update the ledger (status and chapter) or the check"
        )
    _markdown(f":::{{admonition}} Verdict on {claim_id}: {verdict}\n:class: note\n\n{reason}\n:::")
