"""The rows of `axlearn compare` that depend on what the runs logged (see
`axlearn.common.run_comparison`): trainable parameters and the model's own metrics.

- "Trainable parameters": the count the trainer wrote to `model_parameters.txt` (its learner's
  update rules: a LoRA run trains its adapters only), after the "Parameters" row.
- Post-training metrics of `metrics.jsonl` at the step "Final loss" is compared at (the last step
  all runs logged): DPO's `model/rewards/*`, GRPO's `model/reward_mean` and `model/kl`
  (`POST_TRAINING_METRICS`).
- The last evaluation all runs share of each evaler (`summaries/<evaler>/jsonl/metrics.jsonl`,
  `EVAL_METRICS`): e.g. "validation rewards/accuracy @ 30", DPO's held-out preference accuracy.

A row appears only when at least one run has a value, so runs that log none of these compare
as before.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Optional, Sequence

# `run_comparison.RunData` and `RowSpec` (not imported here: run_comparison imports this module).
RunData = Any
RowSpec = Any

# The trainer's parameter table (`trainer_metrics.PARAMETER_TABLE_FILE`).
PARAMETER_TABLE = "model_parameters.txt"
_TRAINABLE = re.compile(r"^Trainable parameters: ([\d,]+) of ([\d,]+)", re.MULTILINE)
# (metrics.jsonl key, row title, which direction is better or None).
POST_TRAINING_METRICS = [
    ("model/rewards/accuracy", "DPO reward accuracy", "higher"),
    ("model/rewards/margin", "DPO reward margin", "higher"),
    ("model/rewards/chosen", "DPO chosen reward", None),
    ("model/rewards/rejected", "DPO rejected reward", None),
    ("model/reward_mean", "GRPO mean reward", "higher"),
    ("model/kl", "GRPO KL to reference", None),
]
# (evaler metrics key, which direction is better).
EVAL_METRICS = [("loss", "lower"), ("accuracy", "higher"), ("rewards/accuracy", "higher")]


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: "n/a" if v is None else format(v, fmt)


def trainable_parameters(run: RunData) -> Optional[int]:
    """The run's trainable parameter count from its `model_parameters.txt`, or None.

    Args:
        run: The run (a local directory; None for a remote one).

    Returns:
        The count, or None when the file or its "Trainable parameters" line is missing.
    """
    path = os.path.join(run.path, PARAMETER_TABLE)
    if "://" in run.path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        match = _TRAINABLE.search(f.read(4096))
    return int(match.group(1).replace(",", "")) if match else None


def eval_records(run: RunData) -> dict[str, dict[int, dict[str, Any]]]:
    """{evaler name: {step: record}} of the run's evaler jsonl files (local runs only).

    Args:
        run: The run.

    Returns:
        The records; {} when there are none. Lines that are not JSON are skipped.
    """
    root = os.path.join(run.path, "summaries")
    if "://" in run.path or not os.path.isdir(root):
        return {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "jsonl", "metrics.jsonl")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and "step" in record:
                    out.setdefault(name, {})[int(record["step"])] = record
    return out


def _value(record: Optional[dict[str, Any]], key: str) -> Optional[float]:
    v = (record or {}).get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def row_specs(
    base_rows: Sequence[RowSpec],
    runs: Sequence[RunData],
    loss_step: Optional[int],
    *,
    row_cls: Callable[..., RowSpec],
) -> list[RowSpec]:
    """The comparison's rows: `base_rows` with the rows these runs have values for.

    Args:
        base_rows: The fixed rows (`run_comparison.ROWS`).
        runs: The runs (`run_comparison.RunData`).
        loss_step: The step "Final loss" is compared at (None: no loss logged).
        row_cls: `run_comparison.RowSpec`: called with (key, title, better, get, fmt).

    Returns:
        The rows, in table order.
    """
    rows = list(base_rows)
    if any(trainable_parameters(r) is not None for r in runs):
        spec = row_cls(
            "trainable_parameters", "Trainable parameters", None, trainable_parameters, _num(",")
        )
        at = next((i + 1 for i, s in enumerate(rows) if s.key == "parameters"), len(rows))
        rows.insert(at, spec)
    by_step = {id(r): {int(rec["step"]): rec for rec in r.records} for r in runs}
    for key, title, better in POST_TRAINING_METRICS:
        values = {i: _value(s.get(loss_step), key) for i, s in by_step.items()}
        if loss_step is None or all(v is None for v in values.values()):
            continue

        def get(r: RunData, values=values) -> Optional[float]:
            return values[id(r)]

        rows.append(row_cls(f"metric:{key}", f"{title} @ {loss_step}", better, get, _num(".4f")))
    evals = [eval_records(r) for r in runs]
    for name in sorted(set().union(*evals)):
        steps = [set(e.get(name, {})) for e in evals]
        common = set.intersection(*steps)
        if not common:
            continue
        step = max(common)
        for key, better in EVAL_METRICS:
            values = {id(r): _value(e[name][step], key) for r, e in zip(runs, evals)}
            if all(v is None for v in values.values()):
                continue
            rows.append(
                row_cls(
                    f"eval:{name}:{key}",
                    f"{name} {key} @ {step}",
                    better,
                    lambda r, values=values: values[id(r)],
                    _num(".4f"),
                )
            )
    return rows
