"""Sphinx extension: the built book loads nothing from another host, so it reads the same offline.

Listed in ``_config.yml`` (``sphinx.extra_extensions``). On every page it

* drops the scripts of sphinx-thebe, which Jupyter Book always loads although this book has no launch
  buttons: an inline script naming thebe's address on a CDN (added twice by Sphinx 7.4, so the second copy
  throws "Identifier 'THEBE_JS_URL' has already been declared" in the console) and its loader;
* fails the build when a script or stylesheet of the page would come from another host, naming it
  (MathJax is served from ``book/_static/mathjax``, which ``make install`` fills from the pinned npm package);
* fails the build when the page needs MathJax and ``mathjax_path`` points at a file that is not there.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.errors import ExtensionError

__all__ = ["setup"]

_THEBE_FILES = {"sphinx-thebe.js"}


def _is_remote(filename) -> bool:
    name = str(filename or "")
    return "://" in name or name.startswith("//")


def _is_thebe(asset) -> bool:
    body = (getattr(asset, "attributes", None) or {}).get("body", "")
    return str(asset.filename or "") in _THEBE_FILES or "THEBE_JS_URL" in body


def _page_assets(app, pagename, templatename, context, doctree) -> None:
    if "script_files" in context:
        kept, seen = [], set()
        for script in context["script_files"]:
            key = (str(script.filename or ""), repr(sorted(getattr(script, "attributes", {}).items())))
            if _is_thebe(script) or key in seen:
                continue
            seen.add(key)
            kept.append(script)
        context["script_files"] = kept
    remote = [str(a.filename) for key in ("script_files", "css_files") for a in context.get(key, [])
              if _is_remote(a.filename)]
    if remote:
        raise ExtensionError(f"page {pagename} would load {', '.join(remote)} from another host; the book must "
                             "read offline: serve it from book/_static (see the Makefile's install target)")
    mathjax = str(app.config.mathjax_path or "")
    if mathjax and any(str(s.filename) == mathjax for s in context.get("script_files", [])):
        static_dirs = [Path(app.confdir) / p for p in app.config.html_static_path]
        if not any((d / mathjax).is_file() for d in static_dirs):
            raise ExtensionError(f"MathJax is not installed at {mathjax} under {app.config.html_static_path}: "
                                 "run `make install` (it copies MathJax from the pinned npm package)")


def setup(app):
    app.connect("html-page-context", _page_assets, priority=900)  # after sphinx.ext.mathjax adds its script
    return {"parallel_read_safe": True, "parallel_write_safe": True}
