"""docs/reliability.md holds exactly the table of tests/reliability_cases.py, whose every test
exists (and runs in this suite)."""

import ast
import os

from tests.reliability_cases import CASES, table

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_case_names_an_existing_test():
    assert len(CASES) >= 40
    for case in CASES:
        path, name = case.test.split("::")
        with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name in names, case.test
        assert case.lost.startswith(("nothing", "the hung step")), case


def test_docs_table_matches():
    with open(os.path.join(_ROOT, "docs", "reliability.md"), encoding="utf-8") as f:
        text = f.read()
    assert table() in text, "regenerate with: python -m tests.reliability_cases"
