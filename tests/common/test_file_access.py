"""Tests of the one file layer (axlearn/common/file_access): every refusal and every guarantee."""

import errno
import json
import os
import threading
import time

import pytest

from axlearn.common import file_access as fa
from axlearn.common.file_access import resolve as fa_resolve

SECRET = b"outside secret 0123456789"


@pytest.fixture(params=["openat2", "component"])
def mode(request, monkeypatch):
    """Runs a test with openat2 and with the component-by-component fallback."""
    if request.param == "component":
        monkeypatch.setitem(fa_resolve._openat2_state, "fn", None)
        monkeypatch.setitem(fa_resolve._openat2_state, "checked", True)
    elif not fa.uses_openat2():
        pytest.skip("the kernel has no openat2")
    return request.param


@pytest.fixture
def run(tmp_path):
    """A run dir with a file, a subdir and an outside sentinel file."""
    root = tmp_path / "run"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.json").write_bytes(b'{"a": [1, 2]}')
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (outside / "f.json").write_bytes(SECRET)
    return root, outside


def _sentinel(outside):
    st = os.stat(outside / "secret")
    return (outside / "secret").read_bytes(), st.st_mtime_ns


def test_reads_and_json(run, mode):
    root, _ = run
    assert fa.read_json(str(root), "sub/f.json", max_bytes=100) == {"a": [1, 2]}
    assert fa.read_bytes(str(root), "./sub//f.json", max_bytes=13) == b'{"a": [1, 2]}'
    with fa.RunDir(str(root)) as d:
        assert fa.read_text(d, "sub/f.json", max_bytes=100).startswith("{")
        with fa.open_read(d, "sub/f.json") as f:
            assert f.read(4) == b'{"a"'
    assert fa.listdir(str(root)) == ["sub"]
    assert fa.listdir(str(root), "sub") == ["f.json"]


def test_missing_and_refused_paths(run, mode):
    root, _ = run
    with pytest.raises(fa.FileAccessError, match=r"run/sub/none.json: does not exist") as e:
        fa.read_bytes(str(root), "sub/none.json", max_bytes=10)
    assert isinstance(e.value, FileNotFoundError) and e.value.errno == errno.ENOENT
    for bad, why in (("/etc/passwd", "absolute"), ("sub/../../outside/secret", r"'\.\.'")):
        with pytest.raises(fa.FileAccessError, match=why):
            fa.read_bytes(str(root), bad, max_bytes=100)
    with pytest.raises(fa.FileAccessError, match="does not exist"):
        fa.RunDir(str(root / "nope"))


def test_link_at_last_and_middle_component_refused(run, mode):
    root, outside = run
    before = _sentinel(outside)
    os.symlink(outside / "secret", root / "last")
    os.symlink(outside, root / "middle")
    for rel in ("last", "middle/secret", "middle/f.json"):
        with pytest.raises(fa.FileAccessError, match="symbolic link") as e:
            fa.read_bytes(str(root), rel, max_bytes=1000)
        assert SECRET.decode() not in str(e.value)
    # Writes through a linked directory are refused; a link at the name itself is replaced.
    with pytest.raises(fa.FileAccessError, match="symbolic link"):
        fa.write_atomic(str(root), "middle/secret", b"x")
    with pytest.raises(fa.FileAccessError, match="symbolic link"):
        fa.append_line(str(root), "last", b"x")
    with pytest.raises(fa.FileAccessError, match="symbolic link"):
        fa.makedirs(str(root), "middle/new")
    with pytest.raises(fa.FileAccessError, match="symbolic link"):
        fa.open_write(str(root), "last")
    fa.write_atomic(str(root), "last", b"mine")
    assert not os.path.islink(root / "last") and (root / "last").read_bytes() == b"mine"
    assert _sentinel(outside) == before
    assert not (outside / "new").exists()


def test_link_above_root_is_the_users_choice(run, tmp_path, mode):
    root, _ = run
    os.symlink(root, tmp_path / "alias")
    assert fa.read_json(str(tmp_path / "alias"), "sub/f.json", max_bytes=100) == {"a": [1, 2]}


def test_dev_zero_link_refused(run, mode):
    root, _ = run
    os.symlink("/dev/zero", root / "zero")
    start = time.monotonic()
    with pytest.raises(fa.FileAccessError, match="symbolic link"):
        fa.read_bytes(str(root), "zero", max_bytes=1 << 40)
    assert time.monotonic() - start < 1


def test_fifo_and_directory_refused_without_blocking(run, mode):
    root, _ = run
    os.mkfifo(root / "fifo")
    start = time.monotonic()
    with pytest.raises(fa.FileAccessError, match="a FIFO"):
        fa.read_bytes(str(root), "fifo", max_bytes=10)
    with pytest.raises(fa.FileAccessError, match="a FIFO"):
        fa.open_write(str(root), "fifo")
    with pytest.raises(fa.FileAccessError, match="a FIFO"):
        fa.append_line(str(root), "fifo", b"x")
    with pytest.raises(fa.FileAccessError, match="a directory"):
        fa.open_read(str(root), "sub")
    assert time.monotonic() - start < 1


def test_huge_file_is_bounded(run, mode):
    root, _ = run
    with open(root / "big", "wb") as f:
        f.truncate(1 << 30)  # Sparse: 1 GiB that costs nothing to make.
    with pytest.raises(fa.FileAccessError, match="larger than 4096 bytes") as e:
        fa.read_json(str(root), "big", max_bytes=4096)
    assert e.value.errno == errno.EFBIG


def test_truncated_wrong_types_and_non_utf8(run, mode):
    root, _ = run
    (root / "trunc.json").write_bytes(b'{"a": [1, 2')
    with pytest.raises(fa.FileAccessError, match=r"trunc.json: is not valid JSON \(line 1"):
        fa.read_json(str(root), "trunc.json", max_bytes=100)
    (root / "bad.json").write_bytes(b'{"a": "\xff\xfe secret"}')
    with pytest.raises(fa.FileAccessError, match=r"bad.json: is not UTF-8 text .*offset 7") as e:
        fa.read_json(str(root), "bad.json", max_bytes=100)
    assert "secret" not in str(e.value)
    # Wrong JSON types are the caller's to check: the layer returns what the file holds.
    (root / "types.json").write_bytes(b'{"step": "7b"}')
    assert fa.read_json(str(root), "types.json", max_bytes=100) == {"step": "7b"}


def test_deep_nesting_is_one_error(run, mode):
    root, _ = run
    (root / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(fa.FileAccessError, match="nested 100000 deep, more than the limit of 64"):
        fa.read_json(str(root), "deep.json", max_bytes=1 << 20)
    # Brackets inside strings do not count.
    text = json.dumps({"k": "[[[[" * 100 + '\\"[', "l": [[1]]}).encode()
    assert fa.json_depth(text) == 3
    assert fa.read_json(str(root), "sub/f.json", max_bytes=100, max_depth=2) == {"a": [1, 2]}
    with pytest.raises(fa.FileAccessError, match="nested 2 deep"):
        fa.read_json(str(root), "sub/f.json", max_bytes=100, max_depth=1)


def test_concurrent_atomic_writes_are_never_torn(run, mode):
    root, _ = run
    payloads = [bytes([65 + i]) * (200_000 + i) for i in range(4)]
    fa.write_atomic(str(root), "state", payloads[0])
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            fa.write_atomic(str(root), "state", payloads[i % 4])
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    seen = set()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            data = fa.read_bytes(str(root), "state", max_bytes=1 << 20)
            assert data in payloads, f"torn read of {len(data)} bytes"
            seen.add(data[:1])
    finally:
        stop.set()
        thread.join()
    assert len(seen) >= 2  # The reader saw the writer's changes, never a part of one.
    assert not [n for n in os.listdir(root) if n.startswith(".state.tmp")]


def test_append_line_and_tree_operations(run, mode):
    root, outside = run
    fa.makedirs(str(root), "a/b/c")
    fa.append_line(str(root), "a/b/log", b'{"x": 1}')
    fa.append_line(str(root), "a/b/log", b'{"x": 2}\n')
    assert (root / "a/b/log").read_bytes() == b'{"x": 1}\n{"x": 2}\n'
    with pytest.raises(ValueError, match="one line"):
        fa.append_line(str(root), "a/b/log", b"1\n2\n")
    assert fa.is_dir(str(root), "a/b") and fa.is_regular(str(root), "a/b/log")
    os.symlink(outside, root / "a" / "b" / "c" / "link")
    (root / "a" / "b" / "c" / "file").write_bytes(b"1")
    fa.rename(str(root), "a/b", "a/moved")
    assert fa.exists(str(root), "a/moved/c/link") and not fa.exists(str(root), "a/b")
    assert not fa.is_dir(str(root), "a/moved/c/link")  # A link to a directory is not one.
    fa.rmtree(str(root), "a")
    assert not (root / "a").exists() and (outside / "secret").read_bytes() == SECRET
    fa.rmtree(str(root), "a", missing_ok=True)
    with pytest.raises(fa.FileAccessError, match="does not exist"):
        fa.rmtree(str(root), "a")
    os.symlink(outside, root / "dirlink")
    fa.rmtree(str(root), "dirlink")  # Removes the link itself, never its target.
    assert (outside / "secret").read_bytes() == SECRET
    with pytest.raises(fa.FileAccessError, match=r"must not use '\.\.'"):
        fa.listdir(str(root), "sub/..")


def test_error_is_oserror_and_pickles(run):
    import pickle  # Only to check that the error crosses process boundaries (never from disk).

    err = fa.FileAccessError("/x/y", "a rule", err=errno.ELOOP)
    assert str(err) == "/x/y: a rule" and isinstance(err, OSError) and err.errno == errno.ELOOP
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.errno == errno.ELOOP


def test_uses_openat2_on_this_kernel():
    # Linux >= 5.6 has openat2; the test machines do. Elsewhere the fallback is tested above.
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    if os.uname().sysname == "Linux" and release >= (5, 6):
        assert fa.uses_openat2()


def test_walk_never_descends_a_link(run, mode):
    root, outside = run
    (root / "sub" / "deep").mkdir()
    (root / "sub" / "deep" / "x").write_bytes(b"1")
    os.symlink(outside, root / "sub" / "link")
    walked = list(fa.walk(str(root), "sub"))
    assert walked == [
        ("sub", ["deep"], ["f.json", "link"]),
        ("sub/deep", [], ["x"]),
    ]
    assert [w[0] for w in fa.walk(str(root))] == [".", "sub", "sub/deep"]
    os.symlink(root / "sub", root / "linked_top")
    with pytest.raises(fa.FileAccessError, match="symbolic link"):
        list(fa.walk(str(root), "linked_top"))


def test_makedirs_exist_ok_false_refuses_any_existing_entry(tmp_path):
    fa.makedirs(str(tmp_path), "a/new", exist_ok=False)  # Parents may exist; the last is created.
    assert os.path.isdir(tmp_path / "a" / "new")
    with pytest.raises(fa.FileAccessError) as e:
        fa.makedirs(str(tmp_path), "a/new", exist_ok=False)
    assert e.value.errno == errno.EEXIST and "already exists" in str(e.value)
    os.symlink(tmp_path / "a", tmp_path / "link")
    with pytest.raises(fa.FileAccessError):
        fa.makedirs(str(tmp_path), "link", exist_ok=False)
    fa.makedirs(str(tmp_path), "a/new")  # exist_ok (the default): nothing happens.
