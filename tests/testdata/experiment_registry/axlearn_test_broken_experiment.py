"""An experiment module whose own import fails: the registry must surface that error as is."""

import axlearn_test_dependency_that_does_not_exist  # noqa: F401


def named_trainer_configs() -> dict:
    """Never reached."""
    return {}
