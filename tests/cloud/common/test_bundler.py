"""Tests axlearn/cloud/common/bundler.py: bundler specs and the git checks."""

from __future__ import annotations

import subprocess

import pytest

from axlearn.cloud.common import bundler


def test_parse_spec():
    spec = bundler.parse_bundler_spec(
        ["image=trainer", "target=gpu", "build_arg.EXTRA=1", "allow_dirty=true"],
        dockerfile="docker/Dockerfile",
    )
    assert spec.image == "trainer" and spec.target == "gpu"
    assert spec.dockerfile == "docker/Dockerfile" and spec.allow_dirty
    assert spec.build_args == {"EXTRA": "1"}


@pytest.mark.parametrize(
    "item,match",
    [
        ("imagename=x", "key 'imagename' does not exist; known keys: allow_dirty, context"),
        ("image", "must be KEY=VALUE"),
        ("allow_dirty=maybe", "allow_dirty='maybe' must be true or false"),
    ],
)
def test_bad_spec(item, match):
    with pytest.raises(bundler.BundlerError, match=match):
        bundler.parse_bundler_spec([item])


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_state_and_dirty_check(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    state = bundler.git_state(str(tmp_path))
    assert len(state.commit) == 40 and state.dirty_files == []
    bundler.check_clean(state, bundler.BundlerSpec())
    (tmp_path / "a.txt").write_text("changed")
    state = bundler.git_state(str(tmp_path))
    assert state.dirty_files == ["a.txt"]
    with pytest.raises(
        bundler.BundlerError, match=r"1 uncommitted change\(s\) \(a.txt\).*allow_dirty=true"
    ):
        bundler.check_clean(state, bundler.BundlerSpec())
    bundler.check_clean(state, bundler.BundlerSpec(allow_dirty=True))
