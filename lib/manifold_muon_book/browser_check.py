"""Open every page of the built book in headless Chromium, offline, and check what a reader sees.

    python -m manifold_muon_book.browser_check _build/html --out build/browser

Each page is opened from ``file://`` in Debian's Chromium (``make browser`` installs it), which this
module drives over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no network port, no
extra package). A page passes when

* it makes no request outside ``file://`` (every ``http(s)``/``ws(s)`` request is recorded and refused,
  so the test sees the book exactly as a reader without a network does) and loads every file it asks for;
* its console shows no error and no script throws;
* its math is typeset: every ``.math`` element holds rendered MathJax with no TeX error, and no ``\\(``,
  ``\\[`` or ``$$`` is left in the text outside code;
* every image has loaded (natural width > 0);
* every glued value is there (no empty paste, no ``{glue`` left in the text);
* no cross-reference is broken (no ``??``, no unresolved ``xref``, every internal link and ``#anchor``
  points at a file and an id that exist);
* its tables read as tables: no two adjacent cells of a row have their text closer than ``MIN_GAP_PX``
  (``0.0191.9311.967``), two adjacent numeric cells have padding on both facing sides, and no table runs past
  the text column: the table, or the scroll wrapper it sits in, lies inside the content box of the article
  (``.bd-article``; else ``main``), and no formula runs out of its cell. A table that scrolls inside its wrapper
  is allowed, except the tables named in ``FIT_COLUMN`` (the claims ledger), which must fit the column at the
  check's window width.

The window is 1280 px wide (``Chromium``'s default), a laptop's. The static checks on the HTML files (no
``<script src="http...">`` or ``<link href="http...">``, internal links and anchors) need no browser.
Screenshots of the pages named in ``SCREENSHOTS`` are written to ``--out``. The exit status is 0 when every
page passes; the report lists every problem by page.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

__all__ = ["Chromium", "PageReport", "check_book", "static_problems", "find_chromium", "main"]

# page (relative to the html root) -> screenshot name; "#id" scrolls to that element first
SCREENSHOTS = {
    "book/intro.html": "front_page.png",
    "chapters/06_softmax_jacobian.html": "chapter_06.png",
    "chapters/06_softmax_jacobian.html#verdict-b-sj-06": "chapter_06_verdict.png",
    "chapters/06_softmax_jacobian.html#tab-sj-decay": "chapter_06_table.png",
    "chapters/04_solver.html#sec-solver-lean": "chapter_04_lean.png",
    "chapters/04_solver.html#fig-lean-picture": "chapter_04_lean_picture.png",
    "chapters/04_solver.html#sec-solver-timing": "chapter_04_timing.png",
    "chapters/04_solver.html#sec-solver-changes": "chapter_04_changes.png",
    "chapters/04_solver.html#fig-rho-scan": "chapter_04_rho_scan.png",
    "chapters/04_solver.html#fig-newton-preconditioner": "chapter_04_newton_preconditioner.png",
    "chapters/04_solver.html#sec-reference-cost": "chapter_04_reference_cost.png",
    "chapters/04_solver.html#sec-square-closed-form-cost": "chapter_04_square_cost.png",
    "chapters/04_solver.html#sec-square-paired": "chapter_04_square_paired.png",
    "chapters/04_solver.html#sec-square-cost-parts": "chapter_04_square_cost_parts.png",
    "chapters/04_solver.html#sec-square-sync-free": "chapter_04_sync_free.png",
    "chapters/04_solver.html#sec-diagonal-solve": "chapter_04_diagonal_solve.png",
    "chapters/04_solver.html#sec-solver-seeds": "chapter_04_solver_seeds.png",
    "chapters/04_solver.html#fig-solver-settling": "chapter_04_solver_settling.png",
    "chapters/04_solver.html#sec-newton-start": "chapter_04_newton_start.png",
    "chapters/05_five_assignments.html#tab-solver-training": "chapter_05_solver_training.png",
    "chapters/05_five_assignments.html#tab-spread-main": "chapter_05_table.png",
    "chapters/03_dual_ascent.html": "chapter_03.png",
    "chapters/04_solver.html": "chapter_04.png",
    "chapters/07_spectral_evidence.html": "chapter_07.png",
    "chapters/11_normalization_free.html": "chapter_11.png",
    "chapters/11_normalization_free.html#tab-nf-tuned": "chapter_11_tuned.png",
    "chapters/11_normalization_free.html#verdict-p-nf-06": "chapter_11_verdict.png",
    "chapters/13_benchmarks.html": "chapter_13.png",
    "chapters/13_benchmarks.html#tab-ben-tuned-pairs": "chapter_13_tuned.png",
    "chapters/05_five_assignments.html#tab-pairs-main": "chapter_05_pairs.png",
    "chapters/05_five_assignments.html#tab-pairs-cpu-long": "chapter_05_cpu_long_pairs.png",
    "chapters/05_five_assignments.html#fig-five-cpu-long": "chapter_05_cpu_long_figure.png",
    "book/claims.html": "claims_page.png",
    "book/claims.html#claims-table": "claims_table.png",
}
LOCAL_SCHEMES = ("file", "data", "blob", "about", "chrome", "devtools")
PAGE_TIMEOUT_S = 60.0
MIN_GAP_PX = 6  # the least space between the text of two adjacent cells (about half a digit)
FIT_COLUMN = ["table.claims-table"]  # tables that must fit the text column without scrolling sideways

# Runs in the page after its load event: waits for MathJax and the images, then reports what a reader sees.
_INSPECT = r"""
(async () => {
  const MIN_GAP = __MIN_GAP__, FIT_COLUMN = __FIT_COLUMN__;
  const out = {rawTex: [], untypeset: [], mathErrors: [], images: [], glue: [], brokenRefs: [],
               questionMarks: [], crampedTables: [], wideTables: [], mathjax: false};
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    out.mathjax = true;
    await MathJax.startup.promise;
  }
  for (const img of document.images) { img.loading = "eager"; }
  await Promise.all([...document.images].map(img => img.complete ? null :
    new Promise(done => { img.addEventListener("load", done); img.addEventListener("error", done);
                          setTimeout(done, 20000); })));
  if (document.fonts) { await document.fonts.ready; }
  const skip = "pre, code, script, style, textarea, mjx-container, .highlight, .MathJax, mjx-assistive-mml";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const short = s => s.replace(/\s+/g, " ").trim().slice(0, 160);
  while (walker.nextNode()) {
    const node = walker.currentNode, parent = node.parentElement;
    if (!parent || parent.closest(skip)) continue;
    if (parent.closest(".search, #search-results, .bd-search")) continue;
    const text = node.textContent;
    if (/\\\(|\\\)|\\\[|\\\]|\$\$|\\begin\{/.test(text)) out.rawTex.push(short(text));
    if (/\{glue|glue:text/.test(text)) out.glue.push(short(text));
    if (/\?\?/.test(text)) out.questionMarks.push(short(text));
  }
  for (const el of document.querySelectorAll(".math")) {
    if (!el.querySelector("mjx-container")) out.untypeset.push(short(el.textContent));
  }
  for (const el of document.querySelectorAll("mjx-merror, [data-mjx-error]")) {
    out.mathErrors.push(short(el.getAttribute("data-mjx-error") || el.textContent));
  }
  for (const img of document.images) {
    if (!img.complete || img.naturalWidth === 0) out.images.push(img.getAttribute("src"));
  }
  for (const el of document.querySelectorAll(".pasted-text, .pasted-inline")) {
    if (!el.textContent.trim()) out.glue.push("empty pasted value");
  }
  for (const el of document.querySelectorAll(".xref")) {
    if (!el.closest("a")) out.brokenRefs.push(short(el.textContent));
  }
  // Tables. The text box of a cell: the union of its text and typeset math, not its padding.
  const textBox = cell => {
    let box = null;
    const add = r => {
      if (r.width === 0 && r.height === 0) return;
      box = box ? {left: Math.min(box.left, r.left), right: Math.max(box.right, r.right)}
                : {left: r.left, right: r.right};
    };
    for (const math of cell.querySelectorAll("mjx-container")) add(math.getBoundingClientRect());
    const texts = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    while (texts.nextNode()) {
      const node = texts.currentNode;
      if (!node.textContent.trim() || node.parentElement.closest("mjx-container")) continue;  // hidden text: no box
      const range = document.createRange();
      range.selectNodeContents(node);
      add(range.getBoundingClientRect());
    }
    return box;
  };
  const numeric = text => /^[-+−]?(\d[\d,]*(\.\d*)?|\.\d+)(e[-+]?\d+)?\s*(%|x)?$/i.test(text.trim());
  const column = el => {  // the content box of the text column that holds el
    const col = el.closest(".bd-article") || el.closest("main") || document.body;
    const r = col.getBoundingClientRect(), s = getComputedStyle(col);
    return {left: r.left + parseFloat(s.borderLeftWidth) + parseFloat(s.paddingLeft),
            right: r.right - parseFloat(s.borderRightWidth) - parseFloat(s.paddingRight), el: col};
  };
  const px = v => Math.round(v);
  for (const table of document.querySelectorAll("article table, main table")) {
    if (table.closest("mjx-container") || !table.getClientRects().length) continue;
    const name = table.id || (table.closest("[id]") || {}).id || short(table.textContent).slice(0, 60);
    const tableStyle = getComputedStyle(table);
    const spacing = tableStyle.borderCollapse === "separate"
      ? parseFloat((tableStyle.borderSpacing || "0").split(" ")[0]) : 0;
    let worst = null;
    for (const row of table.rows) {
      if (!row.getClientRects().length) continue;  // a row the claims filter hides
      const cells = [...row.cells];
      for (let i = 0; i + 1 < cells.length; i++) {
        const a = cells[i], b = cells[i + 1];
        const ta = a.textContent.trim(), tb = b.textContent.trim();
        if (!ta || !tb) continue;
        const boxA = textBox(a), boxB = textBox(b);
        if (!boxA || !boxB) continue;
        const gap = boxB.left - boxA.right;
        const padding = parseFloat(getComputedStyle(a).paddingRight) + parseFloat(getComputedStyle(b).paddingLeft);
        const bad = gap < MIN_GAP || (numeric(ta) && numeric(tb) && padding + spacing < MIN_GAP);
        if (bad && (worst === null || gap < worst.gap)) worst = {gap, padding: padding + spacing, a: ta, b: tb};
      }
    }
    for (const cell of table.querySelectorAll("td, th")) {  // a formula that runs out of its cell
      if (!cell.getClientRects().length) continue;
      const r = cell.getBoundingClientRect(), s = getComputedStyle(cell);
      const right = r.right - parseFloat(s.paddingRight) + 1;
      const math = [...cell.querySelectorAll("mjx-container")].find(m => m.getBoundingClientRect().right > right);
      if (math) {
        out.wideTables.push(`${name}: a formula ${px(math.getBoundingClientRect().width)} px wide runs out of its ` +
                            `${px(r.width)} px cell: ${short(cell.textContent).slice(0, 60)}`);
        break;
      }
    }
    if (worst) out.crampedTables.push(`${name}: '${worst.a.slice(0, 30)}' | '${worst.b.slice(0, 30)}' ` +
                                      `${px(worst.gap)} px apart, padding ${px(worst.padding)} px`);
    // Width: the table, or the scroll wrapper it sits in (inside the column), must lie inside the column.
    const col = column(table);
    let wrapper = null;
    for (let el = table.parentElement; el && el !== col.el && el !== document.body; el = el.parentElement) {
      if (["auto", "scroll", "hidden"].includes(getComputedStyle(el).overflowX)) { wrapper = el; break; }
    }
    const box = (wrapper || table).getBoundingClientRect();
    const tableWidth = table.getBoundingClientRect().width;
    if (box.left < col.left - 1 || box.right > col.right + 1) {
      out.wideTables.push(`${name}: ${px(box.width)} px wide from x = ${px(box.left)}, past the text column ` +
                          `(x = ${px(col.left)} to ${px(col.right)})`);
    } else if (wrapper && tableWidth > wrapper.clientWidth + 1 && FIT_COLUMN.some(sel => table.matches(sel))) {
      out.wideTables.push(`${name}: ${px(tableWidth)} px wide in a ${px(wrapper.clientWidth)} px column; it must fit ` +
                          "without scrolling sideways");
    }
  }
  return out;
})()
""".replace("__MIN_GAP__", str(MIN_GAP_PX)).replace("__FIT_COLUMN__", json.dumps(FIT_COLUMN))


class Chromium:
    """A headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4 of the child)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 1600):
        self._profile = tempfile.mkdtemp(prefix="book-browser-")
        to_child_r, self._to_child = _high_pipe()
        self._from_child, from_child_w = _high_pipe()

        def wire():  # in the child, before exec: the protocol's fds are 3 (commands in) and 4 (replies out)
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
             "--host-resolver-rules=MAP * ~NOTFOUND",  # belt and braces: no name resolves
             f"--window-size={width},{height}", f"--user-data-dir={self._profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=wire, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.width, self.height = width, height
        self._next_id = 0
        self._replies: dict[int, queue.Queue] = {}
        self.events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_child, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        with self._lock:
                            box = self._replies.get(message["id"])
                        if box is not None:
                            box.put(message)
                    else:
                        if message.get("method") == "Fetch.requestPaused":  # refuse at once, even mid-call
                            self._post("Fetch.failRequest", {"requestId": message["params"]["requestId"],
                                                             "errorReason": "BlockedByClient"},
                                       message.get("sessionId"))
                        self.events.put(message)
        self.events.put({"method": "Browser.closed"})

    def _post(self, method: str, params: dict, session: str | None, box: queue.Queue | None = None) -> int:
        """Write one command; its reply goes to ``box`` (or nowhere)."""
        with self._lock:
            self._next_id += 1
            call_id = self._next_id
            if box is not None:
                self._replies[call_id] = box
            message = {"id": call_id, "method": method, "params": params}
            if session:
                message["sessionId"] = session
            os.write(self._to_child, json.dumps(message).encode() + b"\0")
        return call_id

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60.0):
        box: queue.Queue = queue.Queue()
        call_id = self._post(method, params or {}, session, box)
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"Chromium did not answer {method} within {timeout:.0f} s") from None
        finally:
            with self._lock:
                self._replies.pop(call_id, None)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _high_pipe() -> tuple[int, int]:
    """A pipe whose fds are above 4, so that wiring them to 3 and 4 in the child never clobbers one."""
    r, w = os.pipe()
    high = (fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10))
    os.close(r)
    os.close(w)
    return high


@dataclass
class PageReport:
    page: str
    problems: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    seconds: float = 0.0
    mathjax: bool = False


def _drain(events: queue.Queue, session: str, report: PageReport, browser: Chromium, until: str | None,
           deadline: float) -> None:
    """Handle the page's events until ``until`` arrives (or, when None, until the queue is quiet)."""
    while True:
        try:
            event = events.get(timeout=0.2 if until is None else max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            if until is None:
                return
            if time.monotonic() >= deadline:
                report.problems.append(f"timed out waiting for {until}")
                return
            continue
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Fetch.requestPaused":  # only http(s) and ws(s) are intercepted; the reader refused it
            if params["request"]["url"] not in report.external_requests:
                report.external_requests.append(params["request"]["url"])
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if urlparse(url).scheme not in LOCAL_SCHEMES and url not in report.external_requests:
                report.external_requests.append(url)
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            if params.get("blockedReason") != "inspector" and params.get("errorText") != "net::ERR_BLOCKED_BY_CLIENT":
                report.problems.append(f"failed to load a resource: {params.get('errorText')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            report.problems.append(f"console error: {text[:300]}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            report.problems.append(f"uncaught exception: {text[:300]}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            if "ERR_BLOCKED_BY_CLIENT" not in entry.get("text", ""):
                report.problems.append(f"console error: {entry.get('text', '')[:300]} {entry.get('url', '')}")
        if until is not None and method == until:
            return


def check_page(browser: Chromium, url: str, name: str, screenshot: Path | None = None,
               scroll_to: str | None = None) -> PageReport:
    """Open ``url`` in a fresh tab and return what is wrong with it as a reader sees it."""
    report = PageReport(page=name)
    start = time.monotonic()
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        for method, params in [("Page.enable", {}), ("Runtime.enable", {}), ("Log.enable", {}),
                               ("Network.enable", {}),
                               ("Fetch.enable", {"patterns": [{"urlPattern": p} for p in
                                                              ("http://*", "https://*", "ws://*", "wss://*")]}),
                               ("Emulation.setDeviceMetricsOverride",
                                {"width": browser.width, "height": browser.height, "deviceScaleFactor": 1,
                                 "mobile": False})]:
            browser.send(method, params, session)
        browser.send("Page.navigate", {"url": url}, session)
        _drain(browser.events, session, report, browser, "Page.loadEventFired", start + PAGE_TIMEOUT_S)
        result = browser.send("Runtime.evaluate", {"expression": _INSPECT, "awaitPromise": True,
                                                   "returnByValue": True}, session, timeout=PAGE_TIMEOUT_S)
        _drain(browser.events, session, report, browser, None, 0)  # late console messages and requests
        if "exceptionDetails" in result:
            report.problems.append(f"the page inspection failed: {result['exceptionDetails'].get('text')}")
        else:
            seen = result["result"]["value"]
            report.mathjax = seen["mathjax"]
            labels = {"rawTex": "raw TeX left in the text", "untypeset": "math not typeset",
                      "mathErrors": "TeX error", "images": "image not loaded", "glue": "glued value missing",
                      "brokenRefs": "broken cross-reference", "questionMarks": "'??' in the text",
                      "crampedTables": "table without space between columns",
                      "wideTables": "table too wide"}
            for key, label in labels.items():
                for item in seen[key]:
                    report.problems.append(f"{label}: {item}")
        if screenshot is not None:
            if scroll_to:
                found = browser.send("Runtime.evaluate", {"returnByValue": True, "expression":
                                     f"(e => e ? (e.scrollIntoView(), true) : false)"
                                     f"(document.getElementById({json.dumps(scroll_to)}))"}, session)
                if not found["result"].get("value"):
                    report.problems.append(f"no element #{scroll_to} to show in the screenshot")
                time.sleep(0.3)
            shot = browser.send("Page.captureScreenshot", {"format": "png"}, session)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.send("Target.closeTarget", {"targetId": target})
    for request in report.external_requests:
        report.problems.append(f"request outside file:// (refused): {request}")
    report.seconds = time.monotonic() - start
    return report


# ----------------------------------------------------------------------------- static checks


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.external_assets: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        url = attrs.get("src") if tag in ("script", "img", "iframe") else attrs.get("href") if tag == "link" else None
        if url and (url.startswith(("http://", "https://", "//"))):
            self.external_assets.append(f"<{tag}> {url}")


def _pages(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.html") if "_static" not in p.relative_to(root).parts)


def static_problems(root: str | Path) -> dict[str, list[str]]:
    """Problems visible in the HTML files themselves: assets from another host, dead internal links and anchors."""
    root = Path(root)
    parsed = {}
    for page in _pages(root):
        collector = _Collector()
        collector.feed(page.read_text(encoding="utf-8"))
        parsed[page] = collector
    problems: dict[str, list[str]] = {}
    for page, collector in parsed.items():
        found = [f"loads an asset from another host: {a}" for a in collector.external_assets]
        for href in collector.links:
            scheme = urlparse(href).scheme
            if scheme or href.startswith(("//", "mailto:")):
                continue
            path, anchor = urldefrag(href)
            target = (page.parent / unquote(path)).resolve() if path else page
            if not target.exists():
                found.append(f"link to a missing file: {href}")
                continue
            if anchor and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _Collector().ids
                if target not in parsed:
                    other = _Collector()
                    other.feed(target.read_text(encoding="utf-8"))
                    ids = other.ids
                if unquote(anchor) not in ids:
                    found.append(f"link to a missing anchor: {href}")
        if found:
            problems[str(page.relative_to(root))] = found
    return problems


# ----------------------------------------------------------------------------- the whole book


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("no Chromium found: `make browser` installs Debian's chromium package "
                            "(apt-get install chromium)")


def check_book(root: str | Path, out: str | Path, binary: str | None = None,
               screenshots: dict[str, str] | None = None) -> list[PageReport]:
    """Check every page under ``root`` (static checks, then each in the browser); screenshots go to ``out``."""
    root, out = Path(root).resolve(), Path(out)
    if not (root / "index.html").exists():
        raise FileNotFoundError(f"no built book at {root}: run `make book` first")
    screenshots = SCREENSHOTS if screenshots is None else screenshots
    static = static_problems(root)
    reports = []
    with Chromium(binary or find_chromium()) as browser:
        for page in _pages(root):
            name = str(page.relative_to(root))
            report = check_page(browser, page.as_uri(), name,
                                out / screenshots[name] if name in screenshots else None)
            report.problems = static.get(name, []) + report.problems
            reports.append(report)
        for key, shot in screenshots.items():  # extra views of a page, scrolled to an element
            page, _, anchor = key.partition("#")
            if anchor and (root / page).exists():
                extra = check_page(browser, (root / page).as_uri(), key, out / shot, scroll_to=anchor)
                reports.append(extra)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default="_build/html", help="the built book (default _build/html)")
    parser.add_argument("--out", default="build/browser", help="where screenshots and report.json go")
    parser.add_argument("--chromium", default=None, help="the browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    reports = check_book(args.root, args.out, args.chromium)
    elapsed = time.monotonic() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(
        {"seconds": round(elapsed, 1), "pages": [vars(r) | {"seconds": round(r.seconds, 2)} for r in reports]},
        indent=1) + "\n")
    failed = [r for r in reports if r.problems]
    for r in reports:
        mark = "FAIL" if r.problems else "ok  "
        print(f"{mark} {r.page} ({r.seconds:.1f} s{', MathJax' if r.mathjax else ''})")
        for problem in r.problems:
            print(f"       {problem}")
    shots = sorted(str(p) for p in out.glob("*.png"))
    print(f"{len(reports) - len(failed)} passed, {len(failed)} failed ({len(reports)} page views in {elapsed:.1f} s); "
          f"screenshots: {', '.join(shots) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
