"""benchmarks/axlearn_docs_check.py on a made-up page: blocks, diffs, elisions, assembly."""

import ast
import os
import sys

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import axlearn_docs_check as check  # noqa: E402  pylint: disable=wrong-import-position

PAGE = os.path.join(REPO_ROOT, "tests", "testdata", "docs_check", "page.md")


def _blocks():
    with open(PAGE, encoding="utf-8") as f:
        return check.extract_blocks(f.read())


def test_extract_blocks_kinds_and_lines():
    blocks = _blocks()
    assert [b["kind"] for b in blocks] == ["python", "diff", "diff", "diff", "diff", "bash"]
    assert blocks[0]["line"] == 5 and blocks[0]["code"].startswith("def resnet_imagenet_trainer")


def test_diff_new_text_rounds_three_space_indents():
    text, removes = check.diff_new_text("x = (\n+   y = 1\n-   z = 2\n+from a import b")
    assert text == "x = (\n    y = 1\nfrom a import b" and removes
    assert check.diff_new_text("+    w = 1")[0] == "    w = 1"


def test_fix_elisions():
    code = "def f(a, ...):\n    g(x=1, ...)\nh(\n    y=2,\n    ...\n)\nk(...)"
    fixed, changed = check._fix_elisions(code)
    assert fixed.splitlines()[:2] == ["def f(a, *args, **kwargs):", "    g(x=1)"]
    assert fixed.splitlines()[4] == "" and changed == {1, 2, 5}
    ast.parse(fixed)  # Valid Python; `k(...)` is left to the runner (drops the argument).


def test_assemble_tutorial_keeps_each_statement_once_and_skips_alternatives():
    source = check.assemble_tutorial(_blocks())
    tree = ast.parse(source)
    namespace: dict = {}
    exec(compile(tree, "tutorial", "exec"), namespace)  # pylint: disable=exec-used
    cfg = namespace["named_trainer_configs"]()["tiny"]()
    assert cfg.num_classes == 10  # The alternative's 20 is left out.
    body = check._function_body(tree, "resnet_imagenet_trainer")
    assert [ast.unparse(s) for s in body] == [
        "model_cfg = image_classification.ImageClassificationModel.default_config()",
        "model_cfg.num_classes = 10",
        "model_cfg = image_classification.ImageClassificationModel.default_config().set("
        "num_classes=10)",
        "return model_cfg",
    ]
    assert check._redacted_names(source) == {"model_cfg"}


def test_tainted_lines_follow_names_computed_from_stubs():
    tree = ast.parse("a = 1\nxs = []\nfor i in range(2):\n    xs.append(stub(i))\nb = f(xs)\nc = a")
    lines, names = check._tainted_lines(tree, {"stub"})
    assert lines == {3, 4, 5} and {"xs", "b", "stub"} <= names and "c" not in names
