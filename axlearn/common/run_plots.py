"""Charts of several runs overlaid: what `axlearn compare --plot DIR` draws (matplotlib, PNG).

One chart per quantity, x = step, one line per run named by its label: training loss, learning
rate, gradient norm, step time (steps that contain compile/eval/checkpoint time are left out, as
in the averages), and each evaler's scalars (read from the TensorBoard events the evalers write
under `summaries/<evaler>/`).

Example:

    paths = plot_runs([load_run("/tmp/a"), load_run("/tmp/b")], "/tmp/charts")
"""

from __future__ import annotations

import glob
import os
import re
from typing import Sequence

from axlearn.common.run_comparison import (
    GRADIENT_NORM_KEY,
    LEARNING_RATE_KEY,
    LOSS_KEY,
    STEP_TIME_KEY,
    RunData,
)

# (file stem, record key, y-axis label, log scale).
TRAIN_CHARTS = [
    ("loss", LOSS_KEY, "training loss", False),
    ("learning_rate", LEARNING_RATE_KEY, "learning rate", False),
    ("gradient_norm", GRADIENT_NORM_KEY, "gradient norm", False),
    ("step_time", STEP_TIME_KEY, "step time (s)", False),
]


def read_eval_scalars(run_path: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Reads the evalers' scalar summaries of a run from its TensorBoard events.

    Args:
        run_path: The trainer directory (local).

    Returns:
        {evaler name: {tag: [(step, value), ...] sorted by step}}; the training writer
        (`train_train`) is left out.
    """
    pattern = os.path.join(run_path, "summaries", "*", "events.out.tfevents.*")
    files = [f for f in glob.glob(pattern) if os.path.basename(os.path.dirname(f)) != "train_train"]
    if not files:
        return {}
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    out: dict[str, dict[str, dict[int, float]]] = {}
    for path in sorted(files):
        evaler = os.path.basename(os.path.dirname(path))
        # tf.data reads the event records (`summary_iterator` goes through the deprecated
        # `tf_record_iterator`, which logs a deprecation warning into `axlearn compare`).
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = float(value.simple_value)
                elif value.HasField("tensor"):
                    array = tf.make_ndarray(value.tensor)
                    if array.size != 1 or array.dtype.kind not in "fiu":
                        continue
                    number = float(array.reshape(()))
                else:
                    continue
                out.setdefault(evaler, {}).setdefault(value.tag, {})[int(event.step)] = number
    return {
        evaler: {tag: sorted(points.items()) for tag, points in tags.items()}
        for evaler, tags in out.items()
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def _chart(path: str, title: str, ylabel: str, lines: dict[str, list[tuple[int, float]]]) -> bool:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    lines = {label: points for label, points in lines.items() if points}
    if not lines:
        return False
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, points in lines.items():
        steps, values = zip(*points)
        ax.plot(steps, values, label=label, linewidth=1.2, marker="." if len(steps) < 30 else None)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_runs(runs: Sequence[RunData], out_dir: str) -> list[str]:
    """Draws the comparison charts of `runs` into `out_dir`.

    Args:
        runs: The runs (their labels name the lines).
        out_dir: Output directory (created).

    Returns:
        The PNG paths written (a chart no run has data for is not drawn).
    """
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for stem, key, ylabel, _ in TRAIN_CHARTS:
        lines = {}
        for run in runs:
            if key == STEP_TIME_KEY:
                lines[run.label] = [
                    (int(r["step"]), float(r[key]))
                    for r in run.records
                    if isinstance(r.get(key), (int, float)) and not r.get("excluded_reason")
                ]
            else:
                lines[run.label] = run.series(key)
        path = os.path.join(out_dir, f"{stem}.png")
        if _chart(path, f"{ylabel} vs step", ylabel, lines):
            written.append(path)
    evals = {run.label: read_eval_scalars(run.path) for run in runs if "://" not in run.path}
    pairs = sorted(
        {(e, t) for per_run in evals.values() for e, tags in per_run.items() for t in tags}
    )
    for evaler, tag in pairs:
        lines = {label: per_run.get(evaler, {}).get(tag, []) for label, per_run in evals.items()}
        path = os.path.join(out_dir, f"eval_{_safe(evaler)}_{_safe(tag)}.png")
        if _chart(path, f"{evaler}: {tag} vs step", tag, lines):
            written.append(path)
    return written
