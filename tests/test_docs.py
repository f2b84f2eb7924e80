"""The docs are tested: every ```python block of every docs/**/*.md page runs as a test.

Each block runs on its own, in a fresh namespace whose `__name__` is "__main__" (as if pasted into
a script), so a broken example fails a test named after its page and line, e.g. `config.md:42`.
A block fenced as ```python notest is shown to readers but not run (use it for commands that
need a cluster, a data set or minutes of compute).

Also checked: every page is linked from docs/index.md, and relative links between pages resolve.
"""

import os
import re
from dataclasses import dataclass

import pytest

DOCS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")

# An opening or closing fence: up to 3 spaces of indentation (more inside list items is allowed
# too), then ``` or ~~~ (3 or more), then an optional info string.
_FENCE_RE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass
class DocBlock:
    """A fenced code block of a docs page."""

    # Path relative to docs/, e.g. "config.md".
    page: str
    # 1-based line number of the opening fence.
    line: int
    # The info string words after the fence, e.g. ["python", "notest"].
    info: list[str]
    # The block's code, dedented by the fence's indentation.
    source: str
    # 1-based line number of the closing fence.
    end_line: int = 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[str]:
    """Returns the paths (relative to docs/) of every markdown page, sorted."""
    pages = []
    for dirpath, _, filenames in os.walk(DOCS_DIR):
        for filename in filenames:
            if filename.endswith(".md"):
                pages.append(os.path.relpath(os.path.join(dirpath, filename), DOCS_DIR))
    return sorted(pages)


def parse_blocks(page: str, text: str) -> list[DocBlock]:
    """Returns the fenced code blocks of a markdown page, in order.

    Args:
        page: The page's path, for ids and error messages.
        text: The page's markdown.

    Returns:
        The blocks.

    Raises:
        ValueError: If a fence is never closed.
    """
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE_RE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match.group("indent"), match.group("fence")
        start = i
        body = []
        i += 1
        while i < len(lines):
            close = _FENCE_RE.match(lines[i])
            if (
                close
                and close.group("fence")[0] == fence[0]
                and len(close.group("fence")) >= len(fence)
                and not close.group("info").strip()
            ):
                break
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        else:
            raise ValueError(f"{page}:{start + 1}: code block fence {fence} is never closed")
        blocks.append(
            DocBlock(
                page=page,
                line=start + 1,
                info=match.group("info").split(),
                source="\n".join(body) + "\n",
                end_line=i + 1,
            )
        )
        i += 1
    return blocks


def _read(page: str) -> str:
    with open(os.path.join(DOCS_DIR, page), encoding="utf-8") as f:
        return f.read()


def python_blocks() -> list[DocBlock]:
    """Returns every ```python block of the docs that is not marked `notest`."""
    blocks = []
    for page in doc_pages():
        for block in parse_blocks(page, _read(page)):
            if block.info[:1] == ["python"] and "notest" not in block.info[1:]:
                blocks.append(block)
    return blocks


_BLOCKS = python_blocks()


@pytest.mark.parametrize("block", _BLOCKS, ids=[b.id for b in _BLOCKS])
def test_doc_example(block: DocBlock):
    namespace = {"__name__": "__main__", "__file__": os.path.join(DOCS_DIR, block.page)}
    # Compiled with the page and line as its file name, so tracebacks point into the docs.
    code = compile(block.source, f"docs/{block.page}:{block.line}", "exec")
    exec(code, namespace)  # pylint: disable=exec-used


def test_docs_have_examples():
    # Guards against a parser change (or a renamed folder) that silently runs no example.
    assert "config.md" in doc_pages()
    assert sum(b.page == "config.md" for b in _BLOCKS) >= 5


# [text](target) links (and images): the target must resolve.
_LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _local_links(page: str) -> list[str]:
    text = _read(page)
    # Links inside code blocks are examples, not links: drop those lines.
    lines = text.splitlines()
    for block in parse_blocks(page, text):
        for n in range(block.line - 1, block.end_line):
            lines[n] = ""
    # Inline code spans are not links either.
    text = re.sub(r"`[^`\n]*`", "", "\n".join(lines))
    targets = []
    for target in _LINK_RE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, mailto:, in-page anchors.
        targets.append(target.split("#", 1)[0])
    return targets


def test_index_links_every_page():
    linked = {os.path.normpath(t) for t in _local_links("index.md")}
    unlinked = [p for p in doc_pages() if p != "index.md" and p not in linked]
    assert not unlinked, f"docs/index.md does not link: {unlinked}"


@pytest.mark.parametrize("page", doc_pages())
def test_relative_links_resolve(page: str):
    base = os.path.dirname(os.path.join(DOCS_DIR, page))
    broken = [t for t in _local_links(page) if not os.path.exists(os.path.join(base, t))]
    assert not broken, f"docs/{page} links to missing files: {broken}"


def test_parse_blocks():
    text = (
        "# Title\n"
        "```python\n"
        "x = 1\n"
        "```\n"
        "- item\n"
        "    ```python notest\n"
        "    y = 2\n"
        "    ```\n"
        "~~~text\n"
        "```python\n"
        "~~~\n"
    )
    blocks = parse_blocks("t.md", text)
    assert [(b.id, b.info, b.source) for b in blocks] == [
        ("t.md:2", ["python"], "x = 1\n"),
        ("t.md:6", ["python", "notest"], "y = 2\n"),
        ("t.md:9", ["text"], "```python\n"),
    ]
    with pytest.raises(ValueError, match="t.md:1: code block fence ``` is never closed"):
        parse_blocks("t.md", "```python\nx = 1\n")
