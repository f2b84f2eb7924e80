"""Runs benchmark scripts as on a bare accelerator machine: TensorFlow, seqio, TFDS and
TensorBoard cannot be imported (in the script and in any process it starts)."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SITECUSTOMIZE = """
import importlib.abc, sys

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "seqio", "tensorflow_datasets", "tensorboard"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _Block())
"""


def env_without_tensorflow(site_dir: str) -> dict:
    """An environment whose Python processes cannot import TensorFlow and its relatives.

    Args:
        site_dir: An empty directory for the `sitecustomize.py` that blocks the imports.

    Returns:
        os.environ with PYTHONPATH = site_dir, the repository; JAX_PLATFORMS=cpu; and neither
        XLA_FLAGS nor XLA_PYTHON_CLIENT_MEM_FRACTION (one CPU device, as on a one-GPU machine).
    """
    os.makedirs(site_dir, exist_ok=True)
    with open(os.path.join(site_dir, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(_SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=f"{site_dir}{os.pathsep}{REPO_ROOT}", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    return env
