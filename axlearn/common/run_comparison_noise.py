"""The step-time noise test of `axlearn compare` (`axlearn.common.run_comparison`).

A step-time difference between two runs counts only when a rank test on their per-step times
and the size of the change both say so (see `step_time_noise_test`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Optional, Sequence

# Noise test: a step-time difference counts only when both hold (see `step_time_noise_test`).
NOISE_ALPHA = 0.01
# Step-time differences smaller than this fraction of the baseline's median are noise.
MIN_EFFECT = 0.05


@dataclasses.dataclass(frozen=True)
class NoiseVerdict:
    """Whether two runs' step times differ by more than their own step-to-step spread.

    Attributes:
        significant: True when the difference is outside the noise (both tests agree).
        p_value: Two-sided Mann-Whitney U p-value.
        iqr_a: (q25, q75) of run A's step times.
        iqr_b: (q25, q75) of run B's step times.
        n_a: Samples of A.
        n_b: Samples of B.
        reason: Why, in words.
    """

    significant: bool
    p_value: Optional[float]
    iqr_a: Optional[tuple[float, float]]
    iqr_b: Optional[tuple[float, float]]
    n_a: int
    n_b: int
    reason: str


def _iqr(xs: Sequence[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def step_time_noise_test(
    a: Sequence[float],
    b: Sequence[float],
    *,
    alpha: float = NOISE_ALPHA,
    min_effect: float = MIN_EFFECT,
    min_samples: int = 5,
) -> NoiseVerdict:
    """Tests whether step times `b` differ from `a` beyond the runs' own noise.

    The documented rule: a difference is significant only when (1) a two-sided Mann-Whitney U
    test rejects "same distribution" at level `alpha` and (2) the medians differ by at least
    `min_effect` of the baseline's median. (1) is a rank test: no assumption about the shape of
    the step-time distribution (skewed, with load spikes), and robust to outliers; (2) keeps
    tiny but consistent shifts of long runs, which nobody would act on, out of the red. The
    interquartile ranges are reported with the verdict, to show each run's own spread.

    Args:
        a: Baseline per-step times (compile/eval/checkpoint steps already left out).
        b: Candidate per-step times.
        alpha: Significance level of the U test.
        min_effect: Smallest relative difference of medians that counts.
        min_samples: Fewer samples in either run: not significant ("too few steps").

    Returns:
        The `NoiseVerdict`.
    """
    n_a, n_b = len(a), len(b)
    if n_a < min_samples or n_b < min_samples:
        return NoiseVerdict(
            False, None, None, None, n_a, n_b, f"too few steps to test ({n_a} vs {n_b})"
        )
    from scipy import stats  # pylint: disable=import-outside-toplevel

    p = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    iqr_a, iqr_b = _iqr(a), _iqr(b)
    med_a, med_b = statistics.median(a), statistics.median(b)
    effect = abs(med_b - med_a) / med_a if med_a else math.inf
    significant = p < alpha and effect >= min_effect
    if significant:
        reason = f"U test p={p:.2g} < {alpha}, medians differ by {100 * effect:.1f}%"
    elif p >= alpha:
        reason = f"within noise: U test p={p:.2g} >= {alpha}"
    else:
        reason = f"within noise: medians differ by {100 * effect:.1f}% < {100 * min_effect:g}%"
    return NoiseVerdict(significant, p, iqr_a, iqr_b, n_a, n_b, reason)
