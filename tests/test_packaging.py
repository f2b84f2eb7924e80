"""Packaging checks: the package imports, its metadata is right, and the core stays light.

Import cost: `axlearn.common.config` and `axlearn.common.module` import neither TensorFlow nor seqio
(they take seconds to import). Each check runs in a fresh interpreter, so that modules already
imported by other tests in this process cannot hide (or fake) an import.
"""

import importlib.metadata
import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imported_modules_after(statement: str) -> set[str]:
    """Runs `statement` in a fresh interpreter; returns the top-level modules it imported."""
    code = (
        "import sys, json\n"
        f"{statement}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_config_and_module_do_not_import_tensorflow_or_seqio():
    imported = _imported_modules_after("import axlearn.common.config, axlearn.common.module")
    assert "axlearn" in imported
    heavy = imported & {"tensorflow", "seqio", "tensorflow_text", "tensorflow_datasets", "torch"}
    assert not heavy, f"imported by axlearn.common.config/module: {sorted(heavy)}"


def test_config_does_not_import_jax():
    # The config tree is pure Python (+ numpy, attrs): dumping a config needs no jax.
    imported = _imported_modules_after("import axlearn.common.config")
    assert not imported & {"jax", "jaxlib", "tensorflow", "seqio"}


def test_cli_start_is_light():
    imported = _imported_modules_after("import axlearn.cli.main")
    assert not imported & {"jax", "tensorflow", "seqio", "torch"}


def test_installed_metadata():
    # `pip install -e .` registered the distribution with the console script and the extras.
    dist = importlib.metadata.distribution("axlearn")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"axlearn": "axlearn.cli.main:main"}
    assert "dev" in (dist.metadata.get_all("Provides-Extra") or [])
    requires = " ".join(dist.requires or [])
    for name in ("jax", "optax", "tensorstore", "tensorflow", "seqio", "tensorboard", "protobuf"):
        assert name in requires, name
