"""benchmarks/axlearn_unit_tests.py: finding a snapshot's test files and running one of them."""

import json
import os
import sys

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import axlearn_unit_tests  # noqa: E402  pylint: disable=wrong-import-position


def _write(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _fake_package(root):
    """Our side: axlearn/common/{a.py, sub/__init__.py, sub/b.py}, axlearn/cloud/c.py."""
    for rel in ("common/a.py", "common/sub/__init__.py", "common/sub/b.py", "cloud/c.py"):
        _write(os.path.join(root, "axlearn", rel))


def test_names_of_test_files():
    assert axlearn_unit_tests.file_name("axlearn/common/decoding_test.py") == "decoding"
    assert axlearn_unit_tests.file_name("axlearn/common/kv_cache/kv_test.py") == "kv_cache/kv"
    assert axlearn_unit_tests.file_name("axlearn/cloud/gcp/job_test.py") == "cloud/gcp/job"


def test_discover_a_snapshot_keeps_files_of_modules_that_exist_here(tmp_path):
    ours, snapshot = str(tmp_path / "ours"), str(tmp_path / "snap")
    _fake_package(ours)
    for rel in (
        "common/a_test.py",  # a.py exists here
        "common/sub/b_test.py",  # sub/b.py exists here
        "common/sub_test.py",  # the package sub/ exists here
        "common/missing_test.py",  # no missing.py here
        "cloud/c_test.py",
        "cloud/gcp/d_test.py",
        "common/a_helper.py",  # not a test file
    ):
        _write(os.path.join(snapshot, "axlearn", rel))
    _write(os.path.join(snapshot, "axlearn", "common", "__pycache__", "x_test.py"))
    found, left_out = axlearn_unit_tests.discover(snapshot, package_dir=ours)
    assert found == {
        "a": os.path.join("axlearn", "common", "a_test.py"),
        "cloud/c": os.path.join("axlearn", "cloud", "c_test.py"),
        "sub": os.path.join("axlearn", "common", "sub_test.py"),
        "sub/b": os.path.join("axlearn", "common", "sub", "b_test.py"),
    }
    assert left_out == ["cloud/gcp/d", "missing"]


def test_discover_a_flat_folder_stands_for_axlearn_common(tmp_path):
    ours, flat = str(tmp_path / "ours"), str(tmp_path / "flat")
    _fake_package(ours)
    for name in ("a_test.py", "zz_test.py", "conftest.py"):
        _write(os.path.join(flat, name))
    # A subfolder stands for a package beside axlearn/common (audio/ -> axlearn/audio/).
    _write(os.path.join(ours, "axlearn", "cloud", "e.py"))
    for name in ("cloud/e_test.py", "audio/f_test.py", "__pycache__/g_test.py"):
        _write(os.path.join(flat, name))
    found, left_out = axlearn_unit_tests.discover(flat, package_dir=ours)
    assert found == {
        "a": os.path.join("axlearn", "common", "a_test.py"),
        "cloud/e": os.path.join("axlearn", "cloud", "e_test.py"),
    }
    assert left_out == ["audio/f", "zz"]


def test_discover_the_real_package():
    """Against this repository: a test file of a module we have is found, one we lack is not."""
    found = {}
    for name in ("decoding", "flash_attention/layer", "no_such_module_here"):
        rel = os.path.join("axlearn", "common", *name.split("/")) + "_test.py"
        found[name] = axlearn_unit_tests.module_exists_here(rel)
    assert found == {"decoding": True, "flash_attention/layer": True, "no_such_module_here": False}


def test_run_a_subpackage_file_that_imports_another_reference_test(tmp_path):
    """A file in a subpackage runs as `axlearn.common.<sub>.<name>_test`, imports another of the
    reference's test modules and our package; the lenient mode turns a missing name into failures
    of only the tests that use it."""
    snapshot, scratch = str(tmp_path / "snap"), str(tmp_path / "scratch")
    _write(
        os.path.join(snapshot, "axlearn", "common", "layers_test.py"),
        "SHARED = 3\n",
    )
    _write(
        os.path.join(snapshot, "axlearn", "common", "kv_cache", "kv_cache_test.py"),
        "from axlearn.common.kv_cache import kv_cache\n"
        "from axlearn.common.layers_test import SHARED\n"
        "from axlearn.common.kv_cache.kv_cache import NoSuchNameHere\n"
        "\n"
        "def test_module_name():\n"
        "    assert __name__ == 'axlearn.common.kv_cache.kv_cache_test'\n"
        "    assert SHARED == 3 and kv_cache.__name__ == 'axlearn.common.kv_cache.kv_cache'\n"
        "\n"
        "def test_uses_the_missing_name():\n"
        "    NoSuchNameHere()\n",
    )
    rows = {}
    for mode in ("strict", "lenient"):
        rows[mode] = axlearn_unit_tests.run_file(
            ref_dir=snapshot,
            scratch=scratch,
            site_dir=str(tmp_path / "site"),
            name="kv_cache/kv_cache",
            mode=mode,
            devices=1,
            workers=0,
            timeout=300,
        )
    assert rows["strict"]["imports"] is False
    assert "NoSuchNameHere" in rows["strict"]["import_error"]
    lenient = rows["lenient"]
    assert (lenient["passed"], lenient["failed"], lenient["imports"]) == (1, 1, True), lenient
    assert lenient["causes"] == {"missing: axlearn.common.kv_cache.kv_cache.NoSuchNameHere": 1}
    json.dumps(rows)  # The rows are what the JSON output holds.


def test_stage_data_links_ours_then_the_snapshots(tmp_path):
    """A snapshot's test data replaces ours of the same name; golden configs are not staged; a
    flat folder stages nothing."""
    ours, snapshot, root = str(tmp_path / "ours"), str(tmp_path / "snap"), str(tmp_path / "root")
    testdata = os.path.join("axlearn", "experiments", "testdata")
    _write(os.path.join(ours, testdata, "axlearn.common.a_test.npz"), "ours")
    _write(os.path.join(ours, testdata, "axlearn.common.b_test.npz"), "ours")
    _write(os.path.join(snapshot, testdata, "axlearn.common.b_test.npz"), "snapshot")
    _write(os.path.join(snapshot, testdata, "axlearn.common.c_test", "x.npy"), "snapshot")
    _write(os.path.join(snapshot, testdata, "axlearn.experiments.text.gpt", "cfg.txt"), "config")
    _write(os.path.join(snapshot, "axlearn", "data", "tokenizers", "bpe", "gpt2.model"), "vocab")
    _write(os.path.join(snapshot, "axlearn", "data", "tokenizers", "bpe", "BUILD"), "")
    staged = axlearn_unit_tests.stage_data(ref_dir=snapshot, root=root, package_dir=ours)
    assert staged == sorted(
        [
            os.path.join(testdata, "axlearn.common.b_test.npz"),
            os.path.join(testdata, "axlearn.common.c_test"),
            os.path.join("axlearn", "data", "tokenizers", "bpe", "gpt2.model"),
        ]
    )

    def read(*parts):
        with open(os.path.join(root, *parts), encoding="utf-8") as f:
            return f.read()

    assert read(testdata, "axlearn.common.a_test.npz") == "ours"
    assert read(testdata, "axlearn.common.b_test.npz") == "snapshot"
    assert read(testdata, "axlearn.common.c_test", "x.npy") == "snapshot"
    assert not os.path.exists(os.path.join(root, testdata, "axlearn.experiments.text.gpt"))
    assert not os.path.exists(os.path.join(root, "axlearn", "data", "tokenizers", "bpe", "BUILD"))
    flat = str(tmp_path / "flat")
    _write(os.path.join(flat, "a_test.py"))
    assert axlearn_unit_tests.stage_data(ref_dir=flat, root=str(tmp_path / "r2")) == []
