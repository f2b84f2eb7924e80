"""The package map of docs/index.md ("Map of the package") matches the code; the docs stand alone.

Every path the map names exists; every module of `axlearn/` is in exactly one row (a file named
in a row wins over a folder named in another); and no module imports a module of a later row
(the rows go from the bottom of the stack, config, to the top, the `axlearn` command). The import
graph is the one of tests/test_import_graph.py (module- and function-level imports, read by ast).
"""

import os
import re

import pytest

from tests.test_import_graph import REPO_ROOT, import_graph, module_files

INDEX = os.path.join(REPO_ROOT, "docs", "index.md")
# Package `__init__`s that only hold the version or nothing: in no row.
UNMAPPED = {"axlearn", "axlearn.common"}


def map_rows(text: str) -> list[tuple[str, list[str]]]:
    """The (layer, [paths]) rows of the map's table, in order.

    Args:
        text: The docs/index.md text.

    Returns:
        The rows.
    """
    section = text.split("## Map of the package", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("Layer", "---"):
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _module_of(path: str) -> str:
    return path.rstrip("/").removesuffix(".py").replace("/", ".")


def _row_of_modules(rows, modules) -> dict[str, int]:
    """{module: the index of its row}; a file's row wins over a folder's."""
    owner: dict[str, tuple[int, int]] = {}  # module -> (specificity, row)
    for i, (_, paths) in enumerate(rows):
        for path in paths:
            prefix = _module_of(path)
            for m in modules:
                if m == prefix or (path.endswith("/") and m.startswith(prefix + ".")):
                    specificity = 1 if m == prefix and not path.endswith("/") else 0
                    if m in owner and owner[m][0] == specificity and owner[m][1] != i:
                        raise AssertionError(f"{m} is in two rows of the map")
                    if m not in owner or owner[m][0] < specificity:
                        owner[m] = (specificity, i)
    return {m: row for m, (_, row) in owner.items()}


@pytest.fixture(scope="module")
def rows():
    with open(INDEX, encoding="utf-8") as f:
        return map_rows(f.read())


def test_map_names_existing_paths(rows):
    names = [r[0] for r in rows]
    assert names[0] == "config" and names[-1] == "cli" and len(names) >= 8
    missing = [
        p for _, paths in rows for p in paths if not os.path.exists(os.path.join(REPO_ROOT, p))
    ]
    assert missing == []


def test_every_path_in_the_map_page_exists():
    # Also the paths outside the table (the "where to add" list, the folders outside the package).
    with open(INDEX, encoding="utf-8") as f:
        section = f.read().split("## Map of the package", 1)[1].split("\n## ", 1)[0]
    paths = {
        p.split("<", 1)[0].rstrip("/") for p in re.findall(r"`([\w./<>-]+)`", section) if "/" in p
    }
    paths = {p for p in paths if not p.endswith(".txt")}
    assert len(paths) > 60
    missing = sorted(p for p in paths if not os.path.exists(os.path.join(REPO_ROOT, p)))
    assert missing == []


def test_every_module_is_in_one_row(rows):
    modules = module_files(REPO_ROOT, ["axlearn"])
    owner = _row_of_modules(rows, modules)
    unmapped = sorted(set(modules) - set(owner) - UNMAPPED)
    assert unmapped == [], "modules missing from the map in docs/index.md"


def test_no_module_imports_a_later_row(rows):
    modules = module_files(REPO_ROOT, ["axlearn"])
    owner = _row_of_modules(rows, modules)
    edges = import_graph(modules)
    upward = sorted(
        f"{m} ({rows[owner[m]][0]}) imports {d} ({rows[owner[d]][0]})"
        for m, deps in edges.items()
        if m in owner
        for d in deps
        if d in owner and owner[d] > owner[m]
    )
    assert upward == [], "imports against the map's layer order:\n" + "\n".join(upward)


def test_docs_name_no_file_outside_the_repository():
    # Design notes and shared folders of the people who wrote the code are not shipped: what a
    # reader needs is in docs/ (e.g. the benchmark workloads in performance.md).
    pages = [os.path.join(REPO_ROOT, "README.md")]
    for dirpath, _, files in os.walk(os.path.join(REPO_ROOT, "docs")):
        pages += [os.path.join(dirpath, f) for f in files if f.endswith(".md")]
    found = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if re.search(r"DESIGN\.md|\.\./shared|\bshared/reference", line):
                    found.append(f"{os.path.relpath(page, REPO_ROOT)}:{n}: {line.strip()}")
    assert len(pages) > 10
    assert found == []
