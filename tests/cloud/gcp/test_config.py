"""Tests axlearn/cloud/gcp/config.py: TOML config files, activation, clear errors."""

from __future__ import annotations

import pytest

from axlearn.cloud.gcp import config

DEFAULT = """
[gcp."proj-a:us-east5-a"]
project = "proj-a"
zone = "us-east5-a"
permanent_bucket = "a-perm"
labels = "v5p"

[gcp."proj-b:us-central2-b"]
project = "proj-b"
zone = "us-central2-b"
labels = "v4, gpu"
"""


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home, work


def test_no_config(dirs):
    configs = config.load_configs()
    assert configs.files == [] and configs.sections == {}
    assert config.format_list(configs).startswith("No config file found; looked for:")
    with pytest.raises(config.ConfigError, match="No axlearn config file found"):
        config.active_config()


def test_merge_list_activate_cleanup(dirs):
    home, work = dirs
    (work / ".axlearn").mkdir()
    (work / ".axlearn" / "axlearn.default.config").write_text(DEFAULT)
    # The user's own file overrides a key of the project default.
    (home / ".axlearn.config").write_text('[gcp."proj-a:us-east5-a"]\npermanent_bucket = "mine"\n')
    configs = config.load_configs()
    assert configs.sections["proj-a:us-east5-a"]["permanent_bucket"] == "mine"
    assert configs.sections["proj-a:us-east5-a"]["project"] == "proj-a"
    assert configs.active is None
    listing = config.format_list(configs)
    assert "No GCP project has been activated" in listing
    assert (
        "[ ] proj-a:us-east5-a [v5p]" in listing and "[ ] proj-b:us-central2-b [v4, gpu]" in listing
    )
    with pytest.raises(config.ConfigError, match="No active GCP config"):
        config.active_config()

    with pytest.raises(config.ConfigError, match="2 config sections match"):
        config.select(configs)
    with pytest.raises(config.ConfigError, match="No config section has --label='tpu'"):
        config.select(configs, "tpu")
    name = config.select(configs, "gpu")
    path = config.write_active(name)
    # `.axlearn/` exists here, so the project's user file is written.
    assert path == str(work / ".axlearn" / ".axlearn.config")
    active = config.active_config()
    assert active["_name"] == "proj-b:us-central2-b" and active["project"] == "proj-b"
    assert "[*] proj-b:us-central2-b" in config.format_list(config.load_configs())

    removed = config.cleanup()
    assert sorted(removed) == sorted([str(home / ".axlearn.config"), path])
    assert (work / ".axlearn" / "axlearn.default.config").exists()  # The project's stays.


def test_missing_required_key_names_key_and_file(dirs):
    home, _ = dirs
    cfg = home / ".axlearn.config"
    cfg.write_text('[gcp]\n_active = "p:z"\n[gcp."p:z"]\nproject = "p"\n')
    with pytest.raises(config.ConfigError) as e:
        config.active_config()
    assert str(e.value) == f"Config [gcp.\"p:z\"] has no 'zone' (defined in {cfg})."


def test_bad_toml(dirs):
    home, _ = dirs
    (home / ".axlearn.config").write_text("[gcp\n")
    with pytest.raises(config.ConfigError, match="is not valid TOML"):
        config.load_configs()
