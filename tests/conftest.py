"""Test configuration: an 8-device CPU platform, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# libtpu (the [tpu] extra, for AOT compilation on CPU) takes a machine-wide lock file unless told
# that several processes (pytest-xdist workers, subprocess tests) may load it at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# Session fixtures shared by several test directories.
from tests.trained_run import trained_dir  # noqa: E402,F401
