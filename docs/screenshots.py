"""Render built documentation pages in headless Chromium: screenshots, and a check that MathJax typeset.

    python docs/screenshots.py [--html docs/_build/html] [--out docs/_build/screenshots]

For each page (the home page, an API page with formulas, the gallery and two of its pages) it saves a
PNG and loads the page once more with ``--dump-dom`` to count the formulas
MathJax rendered (``<mjx-container>`` elements, what MathJax 3 puts in place of the TeX source). A page
whose source holds math but whose rendered DOM holds no ``mjx-container`` fails the run: the formulas
did not typeset (MathJax missing from ``_static``, or blocked). Everything is read from ``file://``
URLs; Chromium runs with networking off, so a page that needs the network shows it here. A gallery page
whose ``<img>`` names a file the build did not write, or that has no image, fails too.

Needs a Chromium binary: Debian's ``chromium-headless-shell`` or ``chromium`` package (``--chromium``
names another). Not part of CI.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

PAGES = [
    "index.html",
    "concepts.html",
    "api/geoarray.manifolds.html",
    "getting_started.html",
    "auto_examples/index.html",
    "auto_examples/plot_01_vit_digits.html",
    "auto_examples/plot_03_coupled_oscillator.html",
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=15000"]
OFFLINE = ["--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--disable-background-networking"]


def _chromium(name: str | None) -> str:
    for candidate in [name] if name else ["chromium-headless-shell", "chromium", "chromium-browser"]:
        path = shutil.which(candidate) or (candidate if candidate and Path(candidate).is_file() else None)
        if path:
            return path
    sys.exit("no Chromium found: apt-get install chromium-headless-shell (or pass --chromium PATH)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=Path("docs/_build/html"))
    parser.add_argument("--out", type=Path, default=Path("docs/_build/screenshots"))
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1600)
    args = parser.parse_args(argv)
    chromium = _chromium(args.chromium)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for page in PAGES:
        path = (args.html / page).resolve()
        if not path.is_file():
            print(f"{page}: not built ({path})")
            failed = True
            continue
        url = path.as_uri()
        base = [chromium, *FLAGS, *OFFLINE, f"--window-size={args.width},{args.height}"]
        png = args.out / (page.replace("/", "_").removesuffix(".html") + ".png")
        subprocess.run([*base, f"--screenshot={png.resolve()}", url], check=True, capture_output=True, timeout=120)
        dom = subprocess.run([*base, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=120).stdout
        source = path.read_text(encoding="utf-8")
        tex = len(re.findall(r'class="math[ "]', source)) + source.count(r"\(")
        typeset = dom.count("<mjx-container")
        # figures: every <img> of a gallery page must name a file that the build wrote
        images = re.findall(r'<img[^>]*src="([^"]+)"', source) if "auto_examples" in page else []
        absent = [src for src in images if not (path.parent / src).is_file()]
        ok = (typeset > 0 or tex == 0) and not absent and (images or "auto_examples" not in page)
        failed |= not ok
        print(
            f"{page}: {png} ({png.stat().st_size // 1024} KiB), math in source {tex}, typeset by MathJax {typeset}"
            + (f", images {len(images)} ({len(absent)} missing)" if "auto_examples" in page else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
