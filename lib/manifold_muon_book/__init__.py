"""manifold_muon_book: the tooling of the book, on top of ``manifold_muon`` and ``manifold_muon_lab``.

* ``pipeline``       what `make` executes: run notebooks (papermill) and pages (Jupytext pairs), only when stale
* ``claims``         the claims ledger ``book/claims.yml``: sources, chapter plan, claims, and its checks
* ``verdicts``       a chapter's quotation of a claim and its verdict, checked against the ledger
* ``stated``         numbers glued and tabulated at the precision the text claims
* ``nbval_figures``  a pytest plugin: figures are checked to exist, not compared byte for byte
* ``bench``          micro-benchmarks, each a ratio to a baseline measured in the same run
"""
