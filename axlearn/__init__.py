"""axlearn: a composable config-tree library for training large models with JAX."""

__version__ = "0.1.0"
