"""Every relative link in README.md and docs/ resolves inside the repository: the file exists, and a
``#fragment`` into a markdown file names one of its headings (GitHub's heading anchors). Links to
other sites (a scheme such as https:) are not followed; code blocks and code spans are not links."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: the rendered text lower-cased, everything but
    letters, digits, spaces, hyphens and underscores dropped, spaces made hyphens; repeats get -1, -2."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(files: list[Path], root: Path) -> list[str]:
    """``file: target (why)`` for every relative link in ``files`` that does not resolve."""
    bad = []
    for f in files:
        text = _prose(f.read_text(encoding="utf-8"))
        for target in INLINE.findall(text) + REFERENCE.findall(text):
            if SCHEME.match(target):
                continue
            where, _, fragment = target.partition("#")
            dest = (f.parent / unquote(where)).resolve() if where else f
            name = f"{f.relative_to(root)}: {target}"
            if not dest.exists():
                bad.append(f"{name} (no such file)")
            elif root.resolve() not in dest.parents and dest != root.resolve():
                bad.append(f"{name} (outside the repository)")
            elif fragment and dest.suffix == ".md" and unquote(fragment).lower() not in anchors(dest):
                bad.append(f"{name} (no such heading)")
    return bad


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    assert broken_links(doc_files(ROOT), ROOT) == []


def test_a_missing_file_a_missing_heading_and_a_way_out_are_reported(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("# Outside\n")
    (repo / "docs" / "a.md").write_text("# Title\n\n## Where `x` runs (CPU, 2 cores)\n\ntext\n")
    (repo / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#title) [ok](docs/a.md#where-x-runs-cpu-2-cores) [web](https://x.org/y.md)\n"
        "[gone](docs/gone.md) [bad anchor](docs/a.md#nowhere) ![img](docs/pic.png)\n"
        "`[code](docs/code.md)`\n\n```\n[fenced](docs/fenced.md)\n```\n\n[ref]: docs/refgone.md\n")
    (repo / "docs" / "b.md").write_text("[out](../../outside.md) [self](#nothing) [sib](a.md#title)\n")
    assert broken_links(doc_files(repo), repo) == [
        "README.md: docs/gone.md (no such file)",
        "README.md: docs/a.md#nowhere (no such heading)",
        "README.md: docs/pic.png (no such file)",
        "README.md: docs/refgone.md (no such file)",
        "docs/b.md: ../../outside.md (outside the repository)",
        "docs/b.md: #nothing (no such heading)",
    ]
