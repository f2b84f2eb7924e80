"""benchmarks/axlearn_unit_tests_table.py: causes, counts, the page's table and bad input."""

import json
import os
import sys
import threading

import pytest

from axlearn.common.file_access.resolve import FileAccessError
from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import axlearn_unit_tests_table as table_mod  # noqa: E402  pylint: disable=wrong-import-position

_DATA = "AXLearn's data not shipped (goldens, vocabularies)"


def _row(passed, failed, skipped, causes=None, imports=True, **extra):
    lenient = dict(passed=passed, failed=failed, skipped=skipped, errors=0, causes=causes or {})
    lenient.update(extra)
    return {"strict": {"imports": imports}, "lenient": lenient}


def _dump(path, files, commit="abc1234"):
    data = {"meta": {"commit": commit, "date": "2026-12-02"}, "files": files}
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "cause,category",
    [
        (
            "missing: axlearn.common.decoding.PrefixMerger",
            "missing name `axlearn.common.decoding.PrefixMerger`",
        ),
        (
            "FileNotFoundError: .../testdata/axlearn.common.layers_test.npz",
            _DATA,
        ),
        ("E   RuntimeError: Pallas TPU kernel needs a TPU", "needs an accelerator"),
        (
            "ModuleNotFoundError: No module named 'axlearn.common.state_builder'",
            "missing module `axlearn.common.state_builder`",
        ),
        (
            "TypeError: forward() got an unexpected keyword argument 'kv_state'",
            "missing argument `kv_state`",
        ),
        ("AssertionError: 1 != 2 | x", "other: AssertionError: 1 != 2 / x"),
    ],
)
def test_cause_category(cause, category):
    assert table_mod.cause_category(cause) == category


def test_table_counts_rates_and_causes(tmp_path):
    older = _dump(
        tmp_path / "old.json",
        {"a": _row(1, 9, 0), "b": _row(8, 2, 1, {"missing: m.X": 2}, imports=False)},
        commit="old0000",
    )
    newer = _dump(
        tmp_path / "new.json",
        {
            # Replaces a's older row.
            "a": _row(9, 1, 0, {"AssertionError: no": 1}),
            # 40 of 400 tests drawn: the counts scale by 10.
            "c": _row(30, 6, 4, {"missing: m.Y": 6}, sampled_from=400),
            # A sample as large as the file: every test ran, nothing is scaled.
            "d": _row(3, 0, 0, sampled_from=3),
        },
    )
    files, _ = table_mod.merge([older, newer])
    text = table_mod.table(files)
    lines = text.splitlines()
    assert "| `a` | yes | 9 | 1 | 0 | 90% | other: AssertionError: no (1) |" in lines
    assert "| `b` | no | 8 | 2 | 1 | 80% | missing name `m.X` (2) |" in lines
    assert (
        "| `c` (est. from 40 of 400) | yes | ~300 | ~60 | ~40 | 83% | missing name `m.Y` (6) |"
        in lines
    )
    assert "| `d` | yes | 3 | 0 | 0 | 100% | - |" in lines
    # Totals: passed 9 + 8 + 300 + 3, failed 1 + 2 + 60; the parts sum to the whole.
    assert "| **all 4** | **3** | **320** | **63** | **41** | **83.6%** | |" in lines
    assert "- missing name `m.Y`: 60" in lines and "- missing name `m.X`: 2" in lines
    measured = table_mod._measured_line(files)
    assert "1 at old0000" in measured and "3 at abc1234" in measured


def test_write_docs_replaces_only_the_marked_text(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        f"# Title\nbefore\n{table_mod.BEGIN}\nold table\n{table_mod.END}\nafter\n", encoding="utf-8"
    )
    table_mod.write_docs(str(page), "new table\n")
    assert page.read_text(encoding="utf-8") == (
        f"# Title\nbefore\n{table_mod.BEGIN}\nnew table\n{table_mod.END}\nafter\n"
    )
    for bad in (
        "no markers\n",
        f"{table_mod.END}\n{table_mod.BEGIN}\n",
        f"{table_mod.BEGIN}\n" * 2 + table_mod.END,
    ):
        page.write_text(bad, encoding="utf-8")
        with pytest.raises(ValueError, match="needs the lines"):
            table_mod.write_docs(str(page), "x\n")
        assert page.read_text(encoding="utf-8") == bad  # Left as it was.


def test_the_docs_page_holds_the_markers():
    path = os.path.join(REPO_ROOT, "docs", "axlearn_differences.md")
    with open(path, encoding="utf-8") as f:
        page = f.read()
    assert page.count(table_mod.BEGIN) == 1 and page.count(table_mod.END) == 1


def test_bad_json_files_name_the_file(tmp_path):
    good = {"a": _row(1, 0, 0)}
    cases = {}
    cases["missing"] = str(tmp_path / "nope.json")
    truncated = tmp_path / "truncated.json"
    truncated.write_text(json.dumps({"files": good})[:-7], encoding="utf-8")
    cases["truncated"] = str(truncated)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000, encoding="utf-8")
    cases["deep"] = str(deep)
    huge = tmp_path / "huge.json"
    with open(huge, "w", encoding="utf-8") as f:
        f.write('{"files": {}, "pad": "')
        f.write("x" * (table_mod.MAX_BYTES + 10))
        f.write('"}')
    cases["huge"] = str(huge)
    link = tmp_path / "link.json"
    link.symlink_to(_dump(tmp_path / "target.json", good))
    cases["link"] = str(link)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases["fifo"] = str(fifo)
    for name, path in cases.items():
        with pytest.raises(FileAccessError) as e:
            table_mod.merge([path])
        assert os.path.basename(path) in str(e.value), name


@pytest.mark.parametrize(
    "data,message",
    [
        ([1, 2], "expected an object with a `files` object"),
        ({"files": []}, "expected an object with a `files` object"),
        ({"files": {"a": 3}}, "files.a is int, expected an object"),
        ({"files": {"a": {"lenient": []}}}, "files.a.lenient is not an object"),
        ({"files": {"a": {"lenient": {"passed": -1}}}}, r"files.a.lenient.passed=-1: not a count"),
        (
            {"files": {"a": {"lenient": {"failed": "2"}}}},
            r"files.a.lenient.failed='2': not a count",
        ),
        ({"files": {"a": {"lenient": {"passed": True}}}}, r"files.a.lenient.passed=True"),
        ({"files": {"a": {"lenient": {"causes": [1]}}}}, "files.a.lenient.causes is not an object"),
    ],
)
def test_wrong_json_types_name_the_field(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=message) as e:
        table_mod.merge([str(path)])
    assert "bad.json" in str(e.value)


def test_a_concurrent_writer_is_read_whole(tmp_path):
    """The harness's --output replaced while the table reads it: each read sees one version."""
    path = tmp_path / "ut.json"
    versions = [{"a": _row(n, 0, 0)} for n in (1, 2)]
    _dump(path, versions[0])
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            n += 1
            _dump(tmp_path / "next.json", versions[n % 2])
            os.replace(tmp_path / "next.json", path)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = set()
        for _ in range(200):
            files, _ = table_mod.merge([str(path)])
            seen.add(files["a"]["lenient"]["passed"])
    finally:
        stop.set()
        thread.join()
    assert seen <= {1, 2}
