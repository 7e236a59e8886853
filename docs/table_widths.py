"""Measure every table of the built documentation in a real browser engine: does it fit the content column?

    pip install PyQt6 PyQt6-WebEngine          # Qt's Chromium (about 550 MiB), not part of the project's extras
    python docs/table_widths.py [--html docs/_build/html] [--widths 1280 1600] [--out DIR]

Each page is loaded from a ``file://`` URL into QtWebEngine (the Chromium engine that PyQt6-WebEngine's
wheels carry, so no system browser is needed; it runs offscreen, with networking off) in a window of
each width, and is measured once MathJax has typeset it, because a typeset formula is wider or narrower
than its TeX source. A table *fits* when

* its right edge is inside the content column (the ``<article>`` element furo puts the page in), and
* the ``.table-wrapper`` around it does not scroll: its content is not wider than what it shows,

and the page as a whole does not scroll sideways. The script prints one line per table that does not fit
(page, window width, the table's first header cell, by how many pixels) and a count per width, and exits
with 1 if any table does not fit. ``--out`` also saves a PNG of every page at every width.

docs/_static/tables.css is what makes the tables fit (cells wrap at any point, a table still too wide
scrolls in its own container, the wrapper's padding inside the column); ``--no-css`` removes that stylesheet
from each page before measuring, to see what it changes (furo's padded wrappers end 3–4 px beyond the column).
Not part of CI: the engine is large and this machine's CI installs only the project's files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# what the page reports: the window's width, the page's own overflow, and per table its geometry
MEASURE = r"""
(() => {
  const article = document.querySelector("article") || document.body;
  const column = article.getBoundingClientRect();
  const root = document.documentElement;
  const tables = [];
  document.querySelectorAll("article table").forEach((table) => {
    const box = table.getBoundingClientRect();
    const wrapper = table.closest(".table-wrapper");
    const head = table.querySelector("th, td");
    tables.push({
      header: head ? head.textContent.trim().slice(0, 40) : "",
      width: box.width,
      beyond_column: box.right - column.right,
      scrolls_by: wrapper ? wrapper.scrollWidth - wrapper.clientWidth : 0,
      visible: box.width > 0,
    });
  });
  return JSON.stringify({
    window: window.innerWidth,
    page_scrolls_by: root.scrollWidth - root.clientWidth,
    tables: tables,
  });
})()
"""

# resolves once MathJax (if the page loads it) has typeset the page
TYPESET = r"""
(() => {
  if (window.__geoarray_typeset !== undefined) return window.__geoarray_typeset;
  if (!window.MathJax || !window.MathJax.startup || !window.MathJax.startup.promise) {
    window.__geoarray_typeset = !document.querySelector("script[src*='mathjax'], script[id*='MathJax']");
    return window.__geoarray_typeset;
  }
  window.__geoarray_typeset = false;
  window.MathJax.startup.promise.then(() => { window.__geoarray_typeset = true; });
  return false;
})()
"""

DROP_CSS = r"""
document.querySelectorAll("link[href*='tables.css']").forEach((link) => link.remove());
"""

TOLERANCE_PX = 0.5  # sub-pixel layout rounding


def _pages(html: Path) -> list[Path]:
    skip = ("_modules", "_static", "_sources", "_images", "genindex", "search", "py-modindex")
    return sorted(
        p for p in html.rglob("*.html") if not any(part.startswith(skip) for part in p.relative_to(html).parts)
    )


def measure(html: Path, widths: list[int], *, css: bool = True, out: Path | None = None) -> list[dict]:
    """One record per (page, width): the page's sideways overflow and each table's geometry."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--disable-gpu --no-sandbox --proxy-server=127.0.0.1:9")
    try:
        from PyQt6.QtCore import QSize, QTimer, QUrl
        from PyQt6.QtWebEngineWidgets import QWebEngineView
        from PyQt6.QtWidgets import QApplication
    except ImportError as exc:
        raise SystemExit(
            f"table_widths.py needs Qt's browser engine ({exc}): pip install PyQt6 PyQt6-WebEngine"
        ) from None

    app = QApplication.instance() or QApplication(sys.argv[:1] or ["table_widths"])
    view = QWebEngineView()
    view.show()
    jobs = [(page, width) for page in _pages(html) for width in widths]
    records: list[dict] = []
    state = {"polls": 0}

    def start() -> None:
        if not jobs:
            app.quit()
            return
        page, width = jobs[0]
        state["polls"] = 0
        view.resize(QSize(width, 1000))
        view.load(QUrl.fromLocalFile(str(page.resolve())))

    def loaded(ok: bool) -> None:
        if not ok:
            page, width = jobs.pop(0)
            records.append({"page": str(page.relative_to(html)), "window": width, "error": "did not load"})
            start()
            return
        if not css:
            view.page().runJavaScript(DROP_CSS)
        poll()

    def poll() -> None:
        state["polls"] += 1

        def typeset(done: bool) -> None:
            if done or state["polls"] > 150:  # 15 s
                QTimer.singleShot(100, lambda: view.page().runJavaScript(MEASURE, record))
            else:
                QTimer.singleShot(100, poll)

        view.page().runJavaScript(TYPESET, typeset)

    def record(result: str) -> None:
        page, width = jobs.pop(0)
        data = json.loads(result)
        data["page"] = str(page.relative_to(html))
        data["typeset"] = state["polls"] <= 150
        records.append(data)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            view.grab().save(str(out / f"{data['page'].replace('/', '_').removesuffix('.html')}_{width}.png"))
        start()

    view.loadFinished.connect(loaded)
    QTimer.singleShot(0, start)
    app.exec()
    return records


def misfits(records: list[dict]) -> list[str]:
    """One line per table (or page) that does not fit its column."""
    lines = []
    for r in records:
        where = f"{r['page']} at {r['window']} px"
        if "error" in r:
            lines.append(f"{where}: {r['error']}")
            continue
        if r["page_scrolls_by"] > TOLERANCE_PX:
            lines.append(f"{where}: the page scrolls sideways by {r['page_scrolls_by']:.0f} px")
        for t in r["tables"]:
            if not t["visible"]:
                continue
            if t["beyond_column"] > TOLERANCE_PX or t["scrolls_by"] > TOLERANCE_PX:
                lines.append(
                    f"{where}: table {t['header']!r} is {t['width']:.0f} px wide, "
                    f"{max(t['beyond_column'], t['scrolls_by']):.0f} px more than its column shows"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=Path("docs/_build/html"))
    parser.add_argument("--widths", type=int, nargs="+", default=[1280, 1600])
    parser.add_argument("--out", type=Path, default=None, help="save a PNG of every page at every width here")
    parser.add_argument("--no-css", action="store_true", help="measure without docs/_static/tables.css")
    args = parser.parse_args(argv)
    if not (args.html / "index.html").is_file():
        parser.error(f"--html {args.html}: no index.html there; build the docs first (nox -s docs-fast)")
    records = measure(args.html, args.widths, css=not args.no_css, out=args.out)
    bad = misfits(records)
    for line in bad:
        print(line)
    for width in args.widths:
        at = [r for r in records if r["window"] == width and "error" not in r]
        tables = sum(t["visible"] for r in at for t in r["tables"])
        untypeset = sum(not r["typeset"] for r in at)
        wide = sum(1 for line in bad if f" at {width} px" in line)
        print(
            f"{width} px: {len(at)} pages, {tables} tables, {wide} that do not fit"
            + (f", {untypeset} pages whose MathJax did not finish in 15 s" if untypeset else "")
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
