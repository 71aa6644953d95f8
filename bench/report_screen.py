#!/usr/bin/env python3
"""A picture of an evaluate report's first screen: its title, the "answer first" verdicts and the plot under them,
rendered from the report folder as one PNG (for the docs; a reader of the report sees the same in report.md or
report.html).

    .venv/bin/python bench/report_screen.py artifacts/demo/report docs/img/report_first_screen.png
"""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path


def first_screen(report_md: str) -> tuple[str, list[str], str | None]:
    """(title, the answer block's bullet lines without markdown emphasis, the plot file it shows)."""
    lines = report_md.splitlines()
    title = lines[0].lstrip("# ").strip()
    start = next(i for i, x in enumerate(lines) if x.startswith("## The answer first"))
    bullets, plot = [], None
    for x in lines[start + 1:]:
        if x.startswith("## "):
            break
        m = re.match(r"!\[.*\]\((.+)\)", x.strip())
        if m:
            plot = m.group(1)
            break
        if x.startswith("- "):
            bullets.append(re.sub(r"\*\*(.+?)\*\*", r"\1", x[2:]).replace("`", ""))
    return title, bullets, plot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="an evaluate report folder (report.md and its plots)")
    ap.add_argument("out", type=Path, help="PNG to write")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    title, bullets, plot = first_screen((a.report / "report.md").read_text(encoding="utf-8"))
    wrapped = ["\n".join(textwrap.wrap(b, 120, initial_indent="\u2022 ", subsequent_indent="   ")) for b in bullets]
    text_lines = sum(w.count("\n") + 1 for w in wrapped) + len(wrapped)
    fig = plt.figure(figsize=(11, 2.2 + 0.2 * text_lines + (4.2 if plot else 0)))
    top = 1.0 - 0.35 / fig.get_figheight()
    fig.text(0.03, top, title, fontsize=15, weight="bold", va="top")
    y = top - 0.45 / fig.get_figheight()
    fig.text(0.03, y, "The answer first", fontsize=12, weight="bold", va="top")
    y -= 0.35 / fig.get_figheight()
    for w in wrapped:
        fig.text(0.03, y, w, fontsize=9, va="top", family="DejaVu Sans")
        y -= (0.2 * (w.count("\n") + 1) + 0.12) / fig.get_figheight()
    if plot:
        ax = fig.add_axes([0.03, 0.02, 0.94, max(0.05, y - 0.04)])
        ax.imshow(mpimg.imread(a.report / plot))
        ax.axis("off")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=100)
    print(a.out)


if __name__ == "__main__":
    main()
