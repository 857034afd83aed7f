"""README.md is a quick start and a map; the rest is in docs/ (issue 37). Every relative link of
README.md and docs/*.md reaches a file (and its `#anchor` a heading there, by GitHub's slug rule),
every section the long README had still exists as a heading somewhere, and README.md stays short."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

README_MAX_LINES = 250

# The `##`/`###` headings of README.md at commit ffec11f (`git show ffec11f:README.md`), the last
# long README (941 lines): each section moved to a docs page (or stayed) under the same heading.
OLD_README_HEADINGS = [
    "Set-up: two commands on a fresh machine (Debian 12, Python 3.11, CPU only is fine)",
    "PyTorch versions",
    "Install on a cluster",
    "Commands",
    "Configs",
    "Fine-tuning: start from weights",
    "Data",
    "Run directory",
    "Watching a run",
    "Trackers",
    "Slurm",
    "Sites differ",
    "How many nodes?",
    "Status: when will it end",
    "A new cluster, and sweeps",
    "Container runtimes",
    "Containers (Apptainer) and `hpctrain doctor`",
    "Faults: what a run survives, and what it costs",
    "Where does the time go",
    "Performance",
    "The first GPU session: `bench/gpu_accept.py`",
]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, inline code blanked (a `[x](y)` in code is no link)."""
    lines, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped except '-' and '_' (markup
    characters too), each space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.+?)\s*#*\s*$", line)):
            out.append(m.group(1))
    return out


def anchors(text: str) -> set[str]:
    """Every anchor a page's headings get, with GitHub's -1, -2 … for repeated ones."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(text):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def test_slug_follows_githubs_rule():
    assert slug("Status: when will it end") == "status-when-will-it-end"
    assert slug("Containers (Apptainer) and `hpctrain doctor`") == "containers-apptainer-and-hpctrain-doctor"
    assert slug("How often: `ckpt.every: auto` (Young/Daly)") == "how-often-ckptevery-auto-youngdaly"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_every_relative_link_reaches_a_file_and_its_anchor_a_heading():
    broken = []
    for page in pages():
        for line in prose(page.read_text()):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(ROOT)}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no file {path}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                    broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_every_section_of_the_long_readme_is_still_a_heading():
    have = {slug(h) for page in pages() for h in headings(page.read_text())}
    lost = [h for h in OLD_README_HEADINGS if slug(h) not in have]
    assert not lost, f"README sections that are no heading in README.md or docs/*.md: {lost}"


def test_readme_is_a_quick_start_not_the_manual():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move sections to docs/"


def test_readme_maps_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not missing, f"docs pages without a line in README.md's table: {missing}"
