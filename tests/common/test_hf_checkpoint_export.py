"""Tests how axlearn/common/hf_checkpoint.py publishes an export (`save_hf_llama`): a fresh
temporary directory renamed into place, a non-empty target only with `overwrite` and then only
the files an earlier export recorded, nothing written through a link, one file mode for all."""

import json
import os
import stat

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from axlearn.common.hf_checkpoint import (
    EXPORT_MANIFEST_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX_FILE,
    HfConversionError,
    save_hf_llama,
)
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config
from tests.common.test_path_containment import Sentinel


@pytest.fixture(name="model", scope="module")
def fixture_model():
    cfg = transformer_lm_config(
        num_layers=1,
        model_dim=16,
        num_heads=2,
        num_kv_heads=2,
        hidden_dim=32,
        vocab_size=24,
        rope_theta=10000.0,
        norm_eps=1e-5,
        stack="repeat",
        fused_qkv=True,
        tied_embedding=True,
    ).set(name="model")
    params = cfg.instantiate(parent=None).initialize_parameters_recursively(jax.random.PRNGKey(0))
    return cfg, params


def _export(model, out, **kwargs):
    cfg, params = model
    return save_hf_llama(params, cfg, str(out), **kwargs)


def _modes(directory):
    return {
        name: stat.S_IMODE(os.lstat(directory / name).st_mode) for name in os.listdir(directory)
    }


@pytest.mark.parametrize("umask,file_mode", [(0o022, 0o644), (0o077, 0o600)])
def test_fresh_export_is_renamed_into_place_with_one_mode(model, tmp_path, umask, file_mode):
    """Issue 55 item 7: model.safetensors was 0600 while the other files were 0644."""
    out = tmp_path / "hf"
    old = os.umask(umask)
    try:
        written = _export(model, out)
    finally:
        os.umask(old)
    assert sorted(os.listdir(out)) == sorted([*written, EXPORT_MANIFEST_FILE])
    assert set(_modes(out).values()) == {file_mode}
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755 & ~umask
    assert os.listdir(tmp_path) == ["hf"]  # No temporary directory left beside it.
    with open(out / EXPORT_MANIFEST_FILE, encoding="utf-8") as f:
        assert json.load(f) == {"files": sorted(written)}
    assert "model.embed_tokens.weight" in load_file(str(out / SAFETENSORS_FILE))
    # An empty existing directory is replaced the same way.
    empty = tmp_path / "empty"
    empty.mkdir()
    _export(model, empty)
    assert SAFETENSORS_FILE in os.listdir(empty)


def test_non_empty_target_needs_overwrite_and_keeps_other_files(model, tmp_path):
    """Insecure/lost case: hf export deleted every model*.safetensors already in the dir."""
    out = tmp_path / "hf"
    out.mkdir()
    mine = Sentinel(str(out / "model-mine.safetensors"), b"not an export")
    notes = Sentinel(str(out / "notes.txt"))
    with pytest.raises(HfConversionError, match="is not empty .2 entries.; pass --overwrite") as e:
        _export(model, out)
    assert "\n" not in str(e.value)
    assert sorted(os.listdir(out)) == ["model-mine.safetensors", "notes.txt"]
    written = _export(model, out, overwrite=True)
    mine.assert_untouched()
    notes.assert_untouched()
    assert set(written) <= set(os.listdir(out))
    assert set(_modes(out).values()) == {0o644 & ~_current_umask()}


def _current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_overwrite_replaces_only_what_an_export_wrote(model, tmp_path):
    out = tmp_path / "hf"
    sharded = _export(model, out, max_shard_bytes=1000)
    shards = [w for w in sharded if w.startswith("model-")]
    assert len(shards) > 1 and SAFETENSORS_INDEX_FILE in sharded
    keep = Sentinel(str(out / "README.md"))
    single = _export(model, out, overwrite=True)
    # The earlier export's shards and index are gone (it recorded them); README.md is kept.
    assert sorted(os.listdir(out)) == sorted([*single, EXPORT_MANIFEST_FILE, "README.md"])
    keep.assert_untouched()
    # A file of an exported name that no export recorded is refused, before anything changes.
    other = tmp_path / "other"
    other.mkdir()
    foreign = Sentinel(str(other / "config.json"))
    with pytest.raises(HfConversionError, match=r"other/config.json was not written by hf export"):
        _export(model, other, overwrite=True)
    foreign.assert_untouched()
    assert os.listdir(other) == ["config.json"]
    assert sorted(os.listdir(tmp_path)) == ["hf", "other"]


def test_export_never_writes_through_links(model, tmp_path):
    """Insecure case: hf export wrote through links planted in the output directory."""
    out = tmp_path / "hf"
    _export(model, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = Sentinel(str(outside / "secret"))
    # Links planted under names the export writes (and a manifest claiming them).
    os.remove(out / "config.json")
    os.symlink(outside / "secret", out / "config.json")
    os.remove(out / SAFETENSORS_FILE)
    os.symlink(outside / "secret", out / SAFETENSORS_FILE)
    _export(model, out, overwrite=True)
    secret.assert_untouched()
    assert not os.path.islink(out / "config.json") and not os.path.islink(out / SAFETENSORS_FILE)
    # A manifest that is itself a link is refused, naming it.
    os.remove(out / EXPORT_MANIFEST_FILE)
    os.symlink(outside / "secret", out / EXPORT_MANIFEST_FILE)
    with pytest.raises(HfConversionError, match=EXPORT_MANIFEST_FILE) as e:
        _export(model, out, overwrite=True)
    assert "SECRET" not in str(e.value)
    secret.assert_untouched()


@pytest.mark.parametrize(
    "manifest,match",
    [
        (b'{"files": "config.json"}', "field 'files' must be a list of file names"),
        (b'{"files": ["../../x"]}', "field 'files' must be a list of file names"),
        (b"[" * 100_000, "nested"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_bad_manifest_is_one_line(model, tmp_path, manifest, match):
    out = tmp_path / "hf"
    out.mkdir()
    (out / EXPORT_MANIFEST_FILE).write_bytes(manifest)
    with pytest.raises(HfConversionError, match=match) as e:
        _export(model, out, overwrite=True)
    assert "\n" not in str(e.value)
    assert os.listdir(out) == [EXPORT_MANIFEST_FILE]


def test_target_that_is_a_file_or_a_dangling_link(model, tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(HfConversionError, match="exists and is not a directory"):
        _export(model, tmp_path / "file")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(HfConversionError, match="symbolic link to no directory"):
        _export(model, tmp_path / "dangling")
    assert not os.path.exists(tmp_path / "nowhere")
    np.testing.assert_equal(sorted(os.listdir(tmp_path)), ["dangling", "file"])
