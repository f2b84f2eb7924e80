"""axlearn: a composable config-tree library for training large models with JAX."""

from axlearn.common.accelerator_probe import quiet_accelerator_probes as _quiet

__version__ = "0.1.0"

# Before JAX or TensorFlow start, whichever entry point imports axlearn first (the CLI, a
# script calling `trainer.run()` or `InferenceRunner`): on a machine without a TPU or a GPU,
# libtpu's "unexpected worker hostname" and TensorFlow's "failed call to cuInit" E-lines are
# probes of absent hardware, not errors (see axlearn/common/accelerator_probe.py). Variables the
# user set are kept; a machine with the accelerator is left as it is.
_quiet()
