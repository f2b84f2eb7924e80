"""Tests axlearn/common/compilation_cache.py: a second compile loads from the cache."""

import os
import stat

import jax
import jax.numpy as jnp
import pytest

from axlearn.common import compilation_cache


@pytest.fixture
def cache(tmp_path):
    old_dir = jax.config.jax_compilation_cache_dir
    old_min = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.enable(str(tmp_path / "cache"))
    yield str(tmp_path / "cache")
    jax.config.update("jax_compilation_cache_dir", old_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old_min)
    # The cache object keeps its first directory until reset.
    from jax._src import compilation_cache as jax_cc  # pylint: disable=import-outside-toplevel

    jax_cc.reset_cache()


def _compile():
    def f(x):
        return jnp.tanh(x @ x.T).sum() * 3.0 + 1.25

    return jax.jit(f).lower(jax.ShapeDtypeStruct((16, 16), jnp.float32)).compile()


def test_second_compile_is_a_hit(cache):
    from jax._src import compilation_cache as jax_cc  # pylint: disable=import-outside-toplevel

    jax_cc.reset_cache()
    with compilation_cache.CacheLookups() as cold:
        _compile()
    assert cold.hits == 0 and cold.lookups == 1
    assert cold.describe() == "compiled; not in the persistent compilation cache"
    assert os.listdir(cache)  # The executable was written.
    jax.clear_caches()  # As a new process: only the persistent cache is left.
    with compilation_cache.CacheLookups() as warm:
        _compile()
    assert warm.hits == 1 and warm.lookups == 1
    assert warm.describe() == "loaded from the persistent compilation cache: 1 of 1 executables"


def test_resolve_cache_dir():
    assert compilation_cache.resolve_cache_dir(None, trainer_dir="/t") == "/t/compilation_cache"
    assert compilation_cache.resolve_cache_dir("", trainer_dir="/t") == "/t/compilation_cache"
    assert compilation_cache.resolve_cache_dir("/c", trainer_dir="/t") == "/c"
    assert compilation_cache.resolve_cache_dir("none", trainer_dir="/t") is None
    # Multi-process CPU: off by default, on when a directory is given.
    assert compilation_cache.resolve_cache_dir(None, trainer_dir="/t", process_count=2) is None
    assert compilation_cache.resolve_cache_dir("/c", trainer_dir="/t", process_count=2) == "/c"
    assert (
        compilation_cache.resolve_cache_dir(None, trainer_dir="/t", platform="gpu", process_count=2)
        == "/t/compilation_cache"
    )


@pytest.fixture
def jax_cache_config():
    old_dir = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", old_dir)
    from jax._src import compilation_cache as jax_cc  # pylint: disable=import-outside-toplevel

    jax_cc.reset_cache()


def _refused(caplog, cache_dir, trainer_dir):
    before = jax.config.jax_compilation_cache_dir
    with caplog.at_level("WARNING"):
        used = compilation_cache.enable(cache_dir, trainer_dir=trainer_dir, key="run-0")
    assert used is None and jax.config.jax_compilation_cache_dir == before
    lines = [r.getMessage() for r in caplog.records if "compilation cache" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("Persistent compilation cache: off: ")
    return lines[0]


def test_planted_cache_dir_is_refused(tmp_path, caplog, jax_cache_config):
    """Insecure: a planted entry in <trainer_dir>/compilation_cache was loaded and executed
    with no word. A cache dir made by someone else, a linked one, and a group- or
    world-writable one are now refused with one line each."""
    trainer = tmp_path / "run"
    cache = trainer / "compilation_cache"
    cache.mkdir(parents=True)
    (cache / "jit_f-planted-cache").write_bytes(b"evil executable")
    os.chown(cache, 65534, 65534)  # Made by another user of a shared trainer dir.
    line = _refused(caplog, str(cache), str(trainer))
    assert f"{cache} is owned by uid 65534, not by this user" in line
    assert "evil" not in line

    os.chown(cache, os.geteuid(), os.getegid())
    os.chmod(cache, 0o777)
    caplog.clear()
    line = _refused(caplog, str(cache), str(trainer))
    assert "is writable by its group or by others (mode 0777)" in line

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    for p in cache.iterdir():
        p.unlink()
    cache.rmdir()
    cache.symlink_to(elsewhere)
    caplog.clear()
    line = _refused(caplog, str(cache), str(trainer))
    assert "link" in line
    assert list(elsewhere.iterdir()) == []  # Nothing was created through the link.


def test_a_linked_component_below_the_trainer_dir_is_refused(tmp_path, caplog, jax_cache_config):
    trainer = tmp_path / "run"
    trainer.mkdir()
    (tmp_path / "other").mkdir(mode=0o700)
    (trainer / "caches").symlink_to(tmp_path / "other")
    line = _refused(caplog, str(trainer / "caches" / "cc"), str(trainer))
    assert "link" in line
    assert list((tmp_path / "other").iterdir()) == []


def test_accepted_cache_is_private_and_keyed_to_the_run(tmp_path, jax_cache_config):
    trainer = tmp_path / "run"
    dump_a = f"dir: '{trainer}'\nmax_step: 10\ncheckpointer.dir: '{trainer}/checkpoints'\n"
    dump_moved = dump_a.replace(str(trainer), "/elsewhere/run")
    key = compilation_cache.run_key(dump_a, platform="cpu")
    assert key == compilation_cache.run_key(dump_moved, platform="cpu")  # Same config.
    assert key != compilation_cache.run_key(dump_a.replace("10", "11"), platform="cpu")
    assert key != compilation_cache.run_key(dump_a, platform="gpu")
    cache = trainer / "compilation_cache"
    used = compilation_cache.enable(str(cache), trainer_dir=str(trainer), key=key)
    assert used == f"{cache}/{key}" and jax.config.jax_compilation_cache_dir == used
    for d in (cache, cache / key):
        assert stat.S_IMODE(os.lstat(d).st_mode) & 0o077 == 0
