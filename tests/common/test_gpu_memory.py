"""Tests for axlearn/common/gpu_memory.py: the launcher's default GPU memory fraction."""

import os
import subprocess
import sys

from axlearn.common import gpu_memory


def test_sets_default_only_for_gpu_or_unset_backend():
    for backend in ("gpu", None):
        env = {}
        assert gpu_memory.set_default_memory_fraction(backend, env) == "0.9"
        assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
    for backend in ("cpu", "tpu"):
        env = {}
        assert gpu_memory.set_default_memory_fraction(backend, env) is None
        assert env == {}


def test_user_setting_wins():
    for name, value in (
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5"),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
        ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"),
    ):
        env = {name: value}
        assert gpu_memory.set_default_memory_fraction("gpu", env) is None
        assert env == {name: value}
    # An empty value counts as unset.
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ""}
    assert gpu_memory.set_default_memory_fraction("gpu", env) == "0.9"
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == gpu_memory.DEFAULT_GPU_MEMORY_FRACTION


def test_launcher_sets_it_before_devices_start():
    """`launch.setup()` (every launcher's entry) sets the default unless the user did."""
    code = (
        "import os\n"
        "from absl import flags\n"
        "from axlearn.common import launch\n"
        "flags.FLAGS(['launch'])\n"
        "launch.setup()\n"
        "print('FRACTION', os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION'))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for user, expected in ((None, "0.9"), ("0.6", "0.6")):
        env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
        env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
        if user:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = user
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
        assert f"FRACTION {expected}" in out.splitlines()
