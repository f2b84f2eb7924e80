"""Save policies: functions of the step (and eval summaries) that say whether to save.

A policy is built from a config, e.g.
`config_for_function(every_n_steps_and_last_policy).set(n=5000, max_step=750000)`, and called as
`policy(step=step, evaler_summaries=summaries) -> bool`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol, Union

import numpy as np

from axlearn.common.config import REQUIRED, Configurable, Required, config_class
from axlearn.common.metrics import WeightedValue


class CheckpointPolicy(Protocol):
    """Decides whether the checkpointer saves at a step."""

    def __call__(self, *, step: int, evaler_summaries: dict[str, Any]) -> bool:
        """Returns True iff a checkpoint should be saved at `step`.

        Args:
            step: The training step that just completed.
            evaler_summaries: Evaler name -> summaries of that evaler at this step (None where
                the evaler did not run).

        Returns:
            Whether to save.
        """
        raise NotImplementedError(type(self))


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def every_n_steps_policy(
    n: int = 1, *, min_step: int = 1, max_step: Optional[int] = None
) -> CheckpointPolicy:
    """Returns a policy that saves at every step that is a multiple of `n`.

    Args:
        n: The save interval in steps.
        min_step: No saves before this step.
        max_step: If not None, no saves after this step.

    Returns:
        The policy.

    Raises:
        ValueError: If `n` is not a positive integer.
    """
    _check_positive("every_n_steps_policy.n", n)

    def policy(*, step: int, evaler_summaries: dict[str, Any]) -> bool:
        del evaler_summaries
        if step < min_step or (max_step is not None and step > max_step):
            return False
        return step % n == 0

    return policy


def every_n_steps_and_last_policy(
    n: int = 1, *, min_step: int = 1, max_step: int
) -> CheckpointPolicy:
    """Returns a policy that saves every `n` steps from `min_step` on, and at `max_step`.

    Args:
        n: The save interval in steps.
        min_step: No periodic saves before this step.
        max_step: The last training step; always saved. No saves after it.

    Returns:
        The policy.

    Raises:
        ValueError: If `n` is not a positive integer.
    """
    periodic = every_n_steps_policy(n=n, min_step=min_step, max_step=max_step)

    def policy(*, step: int, evaler_summaries: dict[str, Any]) -> bool:
        return step == max_step or periodic(step=step, evaler_summaries=evaler_summaries)

    return policy


# Report the public path (the one config dumps show) for the policy functions.
for _fn in (every_n_steps_policy, every_n_steps_and_last_policy):
    _fn.__module__ = "axlearn.common.checkpointer"
del _fn


class EvalMetric(NamedTuple):
    """Names one metric of one evaler (AXLearn's `BestMetricPolicy.metric` value)."""

    # The evaler's name (a key of the trainer's evalers).
    evaler_name: str
    # The metric's name in that evaler's summaries.
    metric_name: str


class BestMetricPolicy(Configurable):
    """Saves when an evaler's metric is the best seen so far (AXLearn's BestMetricPolicy).

    Steps where the evaler did not run (its summaries are None) do not save. The best value is
    kept in memory only: after a restart, the first evaluated step saves.
    """

    @config_class
    class Config(Configurable.Config):
        """Configures BestMetricPolicy."""

        # The evaler's name (a key of the trainer's evalers); None when `metric` is an EvalMetric.
        evaler: Optional[str] = None
        # The metric: its name in `evaler`'s summaries (a scalar or WeightedScalar), or an
        # EvalMetric(evaler_name, metric_name) naming both (AXLearn's form).
        metric: Required[Union[str, EvalMetric]] = REQUIRED
        # "max" (higher is better) or "min".
        mode: Required[str] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cfg = self.config
        if isinstance(cfg.metric, tuple):
            if cfg.evaler is not None and cfg.evaler != cfg.metric[0]:
                raise ValueError(
                    f"BestMetricPolicy.evaler={cfg.evaler} differs from metric={cfg.metric}; "
                    "leave evaler unset when metric is an EvalMetric."
                )
            self._evaler, self._metric = cfg.metric[0], cfg.metric[1]
        elif cfg.evaler is None:
            raise ValueError(
                f"BestMetricPolicy.metric={cfg.metric!r} needs evaler= (or pass "
                "metric=EvalMetric(evaler_name=..., metric_name=...))."
            )
        else:
            self._evaler, self._metric = cfg.evaler, cfg.metric
        if self.config.mode not in ("max", "min"):
            raise ValueError(
                f"BestMetricPolicy.mode must be 'max' or 'min', got {self.config.mode!r}"
            )
        self.best_metric: Optional[float] = None

    def __call__(self, *, step: int, evaler_summaries: dict[str, Any]) -> bool:
        """Returns True iff the metric at `step` improves on the best so far.

        Raises:
            ValueError: If the evaler or metric is missing, or the metric is not a scalar.
        """
        cfg = self.config
        if self._evaler not in evaler_summaries:
            raise ValueError(
                f"BestMetricPolicy.evaler={self._evaler} not found in evaler_summaries: "
                f"{sorted(evaler_summaries)}; set it to one of the trainer's evalers."
            )
        summaries = evaler_summaries[self._evaler]
        if summaries is None:
            return False
        if self._metric not in summaries:
            raise ValueError(
                f"BestMetricPolicy.metric={self._metric} not found in {self._evaler}'s summaries: "
                f"{sorted(summaries)}; set it to one of them."
            )
        metric = summaries[self._metric]
        if isinstance(metric, WeightedValue):
            metric = metric.mean
        metric = np.asarray(metric)
        if metric.shape != ():
            raise ValueError(
                f"BestMetricPolicy.metric: {self._evaler}/{self._metric} must be a scalar, got "
                f"shape {metric.shape}; pick a scalar summary."
            )
        value = float(metric)
        better = (
            self.best_metric is None
            or (cfg.mode == "max" and value > self.best_metric)
            or (cfg.mode == "min" and value < self.best_metric)
        )
        if better:
            self.best_metric = value
        return better
