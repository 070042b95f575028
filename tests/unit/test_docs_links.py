"""The pages point at what exists: every file path written in backticks on
docs/working-on-it.md is a file or folder of the repository, every `path::name` there names
a function, class or constant defined in that file (read with `ast`), and every relative
link of the README and of docs/*.md reaches a file, and its `#anchor` a heading of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.processes import REPO

WORKING_ON_IT = REPO / "docs" / "working-on-it.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# An inline code span (of one or more backticks), and a path in one: no space, a `/` in it,
# not a URL path (those start with `/`), optionally `::` and a dotted name.
CODE_SPAN = re.compile(r"(`+)(?P<code>.+?)\1")
PATH = re.compile(r"^(?P<path>[\w.-]+/[\w./-]*)(?:::(?P<name>[\w.]+))?$")
# A Markdown link or image, [text](target), and a heading.
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*$")
FENCE = re.compile(r"^\s*```")


def prose(page: Path) -> list[str]:
    """The lines of `page` outside its fenced code blocks."""
    lines, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def code_paths(page: Path) -> list[tuple[str, str | None]]:
    """Each path written in backticks on `page`, with the name after its `::`, if any."""
    found = []
    for line in prose(page):
        for span in CODE_SPAN.finditer(line):
            match = PATH.match(span["code"].strip())
            if match:
                found.append((match["path"], match["name"]))
    return found


def defined(path: Path, name: str) -> bool:
    """Whether `name` (`function`, `Class`, `Class.method`, `CONSTANT`) is defined at the
    top of the module at `path` (a dotted name: within the class)."""
    body = ast.parse(path.read_text()).body
    *classes, last = name.split(".")
    for cls in classes:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            return False
        body = found[0].body
    for node in body:
        definition = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if definition and node.name == last:
            return True
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == last for t in targets):
            return True
    return False


def slug(title: str) -> str:
    """The anchor a heading gets (GitHub's rule: lower case, punctuation dropped, spaces to
    hyphens)."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m["title"]) for line in prose(page) if (m := HEADING.match(line))}


def test_every_path_on_the_working_on_it_page_exists() -> None:
    paths = code_paths(WORKING_ON_IT)
    assert len(paths) > 20
    missing = sorted({path for path, _ in paths if not (REPO / path).exists()})
    assert not missing, f"docs/working-on-it.md names paths that do not exist: {missing}"


def test_every_name_on_the_working_on_it_page_is_defined_in_its_file() -> None:
    named = [(path, name) for path, name in code_paths(WORKING_ON_IT) if name]
    assert len(named) > 20
    wrong = [
        f"{path}::{name}"
        for path, name in named
        if not (REPO / path).is_file() or not defined(REPO / path, name)
    ]
    assert not wrong, f"docs/working-on-it.md names what its file does not define: {wrong}"


def test_every_relative_link_reaches_a_file_and_its_anchor() -> None:
    broken = []
    for page in PAGES:
        for line in prose(page):
            for link in LINK.finditer(line):
                target = link["target"]
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                reached = (page.parent / file).resolve() if file else page
                where = f"{page.relative_to(REPO)}: {target}"
                if not reached.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_every_docs_page_and_picture_is_linked_from_a_page() -> None:
    readme = (REPO / "README.md").read_text()
    unlinked = [
        page.name
        for page in (REPO / "docs").iterdir()
        if page.suffix in (".md", ".png")
        and f"(docs/{page.name}" not in readme
        and f"({page.name}" not in "".join(p.read_text() for p in PAGES)
    ]
    assert not unlinked, f"docs pages no page links to: {unlinked}"
