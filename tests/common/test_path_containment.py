"""Tests axlearn/common/path_containment.py and its use by run files: paths read from files stay
inside their directory; `run.lock` and the run record are never written through a link."""

import os

import pytest

from axlearn.common import run_record
from axlearn.common.path_containment import (
    CONTAINMENT_RULE,
    PathContainmentError,
    contained_path,
    contained_relpath,
    open_no_follow,
    write_text_no_follow,
)
from axlearn.common.run_lock import RunLock, RunLockError


class Sentinel:
    """A file outside the directory under test whose bytes and mtime must not change."""

    def __init__(self, path: str, data: bytes = b"SECRET-CONTENT-0123456789\n"):
        self.path = path
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        self.data = data
        self.mtime_ns = os.stat(path).st_mtime_ns

    def assert_untouched(self):
        with open(self.path, "rb") as f:
            assert f.read() == self.data
        assert os.stat(self.path).st_mtime_ns == self.mtime_ns


@pytest.mark.parametrize(
    "entry,reason",
    [
        ("/etc/passwd", "is absolute"),
        ("../outside/file", "leaves the directory"),
        ("a/../../outside", "leaves the directory"),
        (".", "leaves the directory"),
        ("", "is not a non-empty path string"),
        (7, "is not a non-empty path string"),
    ],
)
def test_contained_path_refuses_escapes(tmp_path, entry, reason):
    base = tmp_path / "d"
    base.mkdir()
    with pytest.raises(PathContainmentError) as e:
        contained_path(str(base), entry, source="d/index", what="leaf 'w'")
    message = str(e.value)
    assert message.startswith("d/index: leaf 'w' names the path")
    assert reason in message and CONTAINMENT_RULE in message


def test_contained_path_refuses_every_link_below_the_directory(tmp_path):
    base = tmp_path / "d"
    (base / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (base / "inner").symlink_to(base / "sub")
    (base / "out").symlink_to(outside)
    assert contained_path(str(base), "sub/f", source="s", what="e") == os.path.join(
        str(base), "sub/f"
    )
    # Issue 48: no link is followed below the directory, even one that points inside it (it
    # could be swapped for one pointing out between the check and the open).
    with pytest.raises(PathContainmentError, match="crosses a symbolic link out"):
        contained_path(str(base), "inner/f", source="s", what="e")
    with pytest.raises(PathContainmentError, match="crosses a symbolic link out"):
        contained_path(str(base), "out/f", source="s", what="e")
    # The last component may be a link out only where allowed (a Hugging Face cache's blobs).
    (base / "weights").symlink_to(outside / "blob")
    with pytest.raises(PathContainmentError, match="crosses a symbolic link out"):
        contained_path(str(base), "weights", source="s", what="e")
    assert contained_path(str(base), "weights", source="s", what="e", follow_final_link=True)
    with pytest.raises(PathContainmentError, match="crosses a symbolic link out"):
        contained_path(str(base), "out/f", source="s", what="e", follow_final_link=True)


def test_contained_relpath_is_lexical(tmp_path):
    assert contained_relpath("a/./b//c", source="s", what="e") == "a/b/c"
    assert contained_relpath("a/../b", source="s", what="e") == "b"
    for bad in ("/abs", "..", "a/../..", ".", "", None, "a\0b"):
        with pytest.raises(PathContainmentError, match="s: e names the path"):
            contained_relpath(bad, source="s", what="e")


def test_open_no_follow_refuses_a_link(tmp_path):
    sentinel = Sentinel(str(tmp_path / "sentinel"))
    link = tmp_path / "f"
    link.symlink_to(sentinel.path)
    with pytest.raises(PathContainmentError, match="is a symbolic link"):
        open_no_follow(str(link), os.O_RDWR | os.O_CREAT)
    # A rename-based write replaces the link itself, never its target.
    write_text_no_follow(str(link), "new")
    assert not os.path.islink(link) and link.read_text() == "new"
    sentinel.assert_untouched()


def test_run_lock_refuses_a_planted_link(tmp_path):
    """Case: `run.lock` planted as a link in a shared trainer dir: refused, target untouched."""
    trainer_dir = tmp_path / "shared_tmp_trainer"
    trainer_dir.mkdir()
    sentinel = Sentinel(str(tmp_path / "victim"))
    (trainer_dir / "run.lock").symlink_to(sentinel.path)
    with pytest.raises(RunLockError) as e:
        RunLock(str(trainer_dir)).acquire()
    assert "run.lock is a symbolic link" in str(e.value) and "Remove the link" in str(e.value)
    assert "SECRET" not in str(e.value)
    sentinel.assert_untouched()
    # A dangling link (its target would be created) is refused the same way.
    os.unlink(trainer_dir / "run.lock")
    (trainer_dir / "run.lock").symlink_to(tmp_path / "would_be_created")
    with pytest.raises(RunLockError, match="symbolic link"):
        RunLock(str(trainer_dir)).acquire()
    assert not (tmp_path / "would_be_created").exists()


def test_run_record_never_writes_through_links(tmp_path):
    """Case: run record files and `run_records` planted as links: nothing outside is written."""
    trainer_dir = tmp_path / "t"
    trainer_dir.mkdir()
    sentinel = Sentinel(str(tmp_path / "victim"))
    (trainer_dir / run_record.TRAINER_CONFIG_FILE).symlink_to(sentinel.path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (trainer_dir / run_record.RECORDS_DIR).symlink_to(outside)
    with pytest.raises(PathContainmentError, match="crosses a symbolic link out"):
        run_record.write_run_record(
            str(trainer_dir), trainer_config="a: 1", launch_flags={}, start_step=-1
        )
    assert os.listdir(outside) == []
    os.unlink(trainer_dir / run_record.RECORDS_DIR)
    run_record.write_run_record(
        str(trainer_dir), trainer_config="a: 1", launch_flags={}, start_step=-1
    )
    # The top-level dump replaced the link; the link's target is unchanged.
    assert not os.path.islink(trainer_dir / run_record.TRAINER_CONFIG_FILE)
    assert (trainer_dir / run_record.TRAINER_CONFIG_FILE).read_text() == "a: 1\n"
    sentinel.assert_untouched()
    # A record directory that is a link out is not a record of this run.
    (outside / "record.json").write_text('{"start_step": -1}')
    (trainer_dir / run_record.RECORDS_DIR / "2").symlink_to(outside)
    assert [r["record"] for r in run_record.records(str(trainer_dir))] == [1]


def test_metrics_and_run_summary_are_never_written_through_links(tmp_path):
    """Case: `metrics.jsonl` and `run_summary.json` planted as links in a trainer dir: the
    append is refused naming the link, the summary replaces the link; targets untouched."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import run_summary, summary_writer

    sentinel = Sentinel(str(tmp_path / "victim"))
    trainer_dir = tmp_path / "t"
    trainer_dir.mkdir()
    (trainer_dir / "metrics.jsonl").symlink_to(sentinel.path)
    with pytest.raises(OSError, match="metrics.jsonl is a symbolic link"):
        summary_writer.append_whole_line(str(trainer_dir / "metrics.jsonl"), '{"step": 1}\n')
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        summary_writer.cut_torn_tail(str(trainer_dir / "metrics.jsonl"))
    (trainer_dir / "run_summary.json").symlink_to(sentinel.path)
    path = run_summary.write_run_summary(str(trainer_dir), {"steps": 1})
    assert not os.path.islink(path) and '"steps": 1' in open(path, encoding="utf-8").read()
    sentinel.assert_untouched()
