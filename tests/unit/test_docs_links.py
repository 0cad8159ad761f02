"""The documentation stays true and walkable: README is a short front door, every relative link in it and
in docs/ resolves (file and heading), every page is reachable from README, the option table and the source
map match the code, README's snippets are parts of what the suite runs, and nothing cites what a reader of
the repository cannot follow (numbered tickets, sections of documents outside it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from supervisor.config import CONFIG_ENV, OPTIONS

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())  # wherever tests/ nests it
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "benchmarks" / "RESULTS.md", ROOT / "deploy" / "README.md"]
README_LIMIT = 12_000  # bytes
LINK_RX = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base, n = slug(heading), 0
        while (name := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(name)
    return found


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK_RX.findall(prose(path.read_text())) if not re.match(r"[a-z]+:", t)]


def test_readme_is_a_front_door_under_its_size_limit():
    assert len(README.read_bytes()) < README_LIMIT


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_heading(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README)}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_the_readme_testing_snippet_is_part_of_the_example_the_suite_runs():
    readme = README.read_text().split("## Testing your handlers", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    body = snippet.split("\n", 1)[1]  # below its "# tests/test_jobs.py, from ..." line
    assert body.strip() and body in (ROOT / "docs" / "testing.md").read_text()


def test_the_option_table_lists_exactly_the_daemons_options():
    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `(--[a-z0-9-]+)` \| `([A-Z0-9_]+)` \|", page, re.M))
    expected = {opt.flag: opt.env for opt in OPTIONS} | {"--config": CONFIG_ENV}
    assert rows == expected


def test_the_source_map_names_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    tree = page.split("## The source tree", 1)[1].split("\n## ", 1)[0]
    missing = []
    for path in sorted((ROOT / "supervisor").rglob("*")):
        rel = path.relative_to(ROOT / "supervisor")
        if "__pycache__" in rel.parts or len(rel.parts) > 2 or path.name in ("__init__.py", "__main__.py"):
            continue
        if path.is_dir() or path.suffix in (".py", ".proto"):
            name = f"{path.name}/" if path.is_dir() else path.name
            if not re.search(rf"(?<![\w.]){re.escape(name)}", tree):
                missing.append(str(rel))
    assert missing == []


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    keep = (".py", ".md", ".toml", ".yaml", ".yml", ".proto", ".service", ".json", ".example", ".cfg", ".txt")
    return [ROOT / name for name in out.stdout.split() if name.endswith(keep) or name in (".ci/run",)]


def test_nothing_cites_ticket_numbers_or_sections_of_documents_outside_the_repository():
    ticket = re.compile(r"\bissues? ?#?\d+\b", re.I)
    outside = re.compile(r"CONTRACT(\.md)?,? *(§|sections? \d|\d+\.\d)|/work/shared|\.\./shared")
    found = []
    for path in tracked_text_files():
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ticket.search(line) or outside.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert found == [], "\n".join(found)
