"""Tests axlearn/common/summary_writer.py: event files read back with TensorBoard's reader."""

import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.config import Configurable, config_class
from axlearn.common.metrics import WeightedScalar
from axlearn.common.summary_writer import (
    CompositeWriter,
    JsonlWriter,
    NoOpWriter,
    SummaryWriter,
    cut_torn_tail,
    fetch_to_host,
)


def _accumulator(path: str):
    # pylint: disable-next=import-outside-toplevel
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        path, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.HISTOGRAMS: 0}
    )
    acc.Reload()
    return acc


def _scalar_series(acc, tag: str) -> list[tuple[int, float]]:
    # tf.summary (TF2) writes scalars as tensor events.
    return [(e.step, float(np.asarray(_tensor(e)))) for e in acc.Tensors(tag)]


def _tensor(event):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.make_ndarray(event.tensor_proto)


def _writer(cfg, name="writer"):
    return cfg.set(name=name).instantiate(parent=None)


def test_summary_writer_scalars_text_histograms_readback(tmp_path):
    d = str(tmp_path / "tb")
    writer = _writer(SummaryWriter.default_config().set(dir=d, write_every_n_steps=2))
    for step in range(7):
        writer(
            step,
            dict(
                loss=jnp.float32(10.0 - step),
                learner=dict(lr=0.1 * step, weighted=WeightedScalar(jnp.float32(step), 3.0)),
                note=f"step {step}",
                hist=jnp.arange(5.0) + step,
            ),
        )
    acc = _accumulator(d)
    assert _scalar_series(acc, "loss") == [(0, 10.0), (2, 8.0), (4, 6.0), (6, 4.0)]
    lr = _scalar_series(acc, "learner/lr")
    assert [s for s, _ in lr] == [0, 2, 4, 6]
    assert [v for _, v in lr] == pytest.approx([0.0, 0.2, 0.4, 0.6])
    assert _scalar_series(acc, "learner/weighted") == [(0, 0.0), (2, 2.0), (4, 4.0), (6, 6.0)]
    notes = [(e.step, _tensor(e).item().decode()) for e in acc.Tensors("note")]
    assert notes == [(0, "step 0"), (2, "step 2"), (4, "step 4"), (6, "step 6")]
    hist = acc.Tensors("hist")
    assert [e.step for e in hist] == [0, 2, 4, 6]
    # Histogram buckets: [left, right, count]; counts sum to the 5 values.
    assert _tensor(hist[-1])[:, 2].sum() == 5


def test_scalars_read_back_as_tf_summary_scalar_writes_them(tmp_path):
    """The one-proto-per-step scalar write gives the events tf.summary.scalar gives."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ours, ref = str(tmp_path / "ours"), str(tmp_path / "ref")
    values = {"loss": np.float32(2.5), "a b:c": 3, "x": {"y/z": np.int32(7), "flag": True}}
    writer = _writer(SummaryWriter.default_config().set(dir=ours))
    for step in range(3):
        writer(step, values)
    ref_writer = tf.summary.create_file_writer(ref)
    with ref_writer.as_default():
        for step in range(3):
            for tag, value in [("loss", 2.5), ("a b:c", 3), ("x/y/z", 7), ("x/flag", True)]:
                tf.summary.scalar(tag, value, step=step)
    ref_writer.flush()

    def events(path):
        acc = _accumulator(path)
        return {
            tag: (
                acc.SummaryMetadata(tag).SerializeToString(),
                [(e.step, e.tensor_proto.SerializeToString()) for e in acc.Tensors(tag)],
            )
            for tag in acc.Tags()["tensors"]
        }

    got = events(ours)
    assert sorted(got) == ["a b:c", "loss", "x/flag", "x/y/z"]
    assert got == events(ref)


def test_log_config_written_once_as_text(tmp_path):
    class Thing(Configurable):
        @config_class
        class Config(Configurable.Config):
            x: int = 3  # A field.
            y: str = "a"  # Another.

    d = str(tmp_path / "tb")
    writer = _writer(SummaryWriter.default_config().set(dir=d))
    writer.log_config(Thing.default_config())
    events = _accumulator(d).Tensors("trainer_config")
    assert len(events) == 1
    lines = [s.decode() for s in _tensor(events[0]).tolist()]
    assert lines == Thing.default_config().debug_string().split("\n")
    assert "x: 3" in lines
    # One text summary per field too, holding the value's repr.
    acc = _accumulator(d)
    assert _tensor(acc.Tensors("trainer_config/x")[0]) == b"3"
    assert _tensor(acc.Tensors("trainer_config/y")[0]) == b"'a'"


def test_jsonl_writer_every_step(tmp_path):
    d = str(tmp_path)
    writer = _writer(JsonlWriter.default_config().set(dir=d))
    for step in range(1, 6):
        writer(
            step,
            dict(
                loss=jnp.float32(1.0 / step),
                perf=dict(step_time_s=0.1 * step, overheads=dict(input=0.01)),
                ws=WeightedScalar(jnp.float32(2.0), jnp.float32(4.0)),
                text="hi",
                big=jnp.ones((3,)),  # Arrays of rank >= 1 are not JSONL material.
                bad=float("nan"),
                inf=-float("inf"),
                count=np.int64(step),
            ),
        )
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == 5
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    r = records[1]
    assert r["loss"] == pytest.approx(0.5)
    assert r["perf/step_time_s"] == pytest.approx(0.2)
    assert r["perf/overheads/input"] == pytest.approx(0.01)
    assert r["ws"] == 2.0 and r["text"] == "hi" and r["count"] == 2
    assert r["bad"] == "NaN" and r["inf"] == "-Infinity"
    assert "big" not in r and isinstance(r["time"], float)
    # Strict JSON: no bare NaN tokens.
    for line in lines:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))


def test_composite_writer_dirs_and_single_fetch(tmp_path, monkeypatch):
    d = str(tmp_path)
    cfg = CompositeWriter.default_config().set(
        dir=d,
        writers=dict(
            tb=SummaryWriter.default_config(),
            jsonl=JsonlWriter.default_config().set(dir=d),
            noop=NoOpWriter.default_config(),
        ),
    )
    writer = _writer(cfg)
    assert writer.writers[0].config.dir == os.path.join(d, "tb")
    assert writer.writers[1].file_path == os.path.join(d, "metrics.jsonl")

    calls = []
    real_device_get = jax.device_get

    def counting_device_get(x):
        calls.append(len(jax.tree.leaves(x)))
        return real_device_get(x)

    monkeypatch.setattr(jax, "device_get", counting_device_get)
    writer(3, dict(a=jnp.float32(1.0), b=dict(c=jnp.float32(2.0), d=jnp.int32(7))))
    assert calls == [3]  # One batched transfer of all three device scalars.
    assert _scalar_series(_accumulator(os.path.join(d, "tb")), "b/c") == [(3, 2.0)]


def test_fetch_to_host_returns_numpy():
    tree = dict(a=jnp.ones(()), b=[jnp.arange(3)], c="s", d=1.5, w=WeightedScalar(jnp.ones(()), 2))
    host = fetch_to_host(tree)
    assert isinstance(host["a"], np.ndarray) and isinstance(host["b"][0], np.ndarray)
    assert host["c"] == "s" and host["d"] == 1.5
    assert isinstance(host["w"], WeightedScalar) and isinstance(host["w"].mean, np.ndarray)


def test_invalid_write_every_n_steps(tmp_path):
    with pytest.raises(ValueError, match="write_every_n_steps"):
        _writer(SummaryWriter.default_config().set(dir=str(tmp_path), write_every_n_steps=0))


def test_dump_defaults_match_reference():
    """Rebuilds the reference dump's `summary_writer.` lines (the experiment sets two fields)."""
    cfg = SummaryWriter.default_config().set(max_queue=1000, write_every_n_steps=100)
    path = os.path.join(
        os.path.dirname(__file__), "..", "testdata", "evaler", "reference_summary_writer_lines.txt"
    )
    with open(path, encoding="utf-8") as f:
        expected = f.read().splitlines()
    assert ["summary_writer." + line for line in cfg.debug_string().split("\n")] == expected
    assert SummaryWriter.default_config().debug_string() == (
        "klass: 'axlearn.common.summary_writer.SummaryWriter'\nwrite_every_n_steps: 1"
    )


def test_import_does_not_import_tensorflow():
    code = (
        "import sys; import axlearn.common.summary_writer, axlearn.common.evaler; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _read_wandb_records(run_dir: str) -> list:
    """Parses the records of an offline run's `run-<id>.wandb` file.

    The file is a 7-byte header (":W&B", a 2-byte magic, a version byte) followed by a LevelDB-style
    log: 32 KiB blocks of chunks, each [crc32 (4), length (2, little-endian), type (1), data];
    type 1 is a whole record, 2/3/4 the first/middle/last pieces of one. Each record is a
    `wandb_internal_pb2.Record` protobuf.
    """
    import glob

    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, records, pending = 7, [], b""
    block = 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _finished_records(run_dir: str, timeout: float = 60) -> list:
    """The run's records once its "exit" record is on disk (W&B's service writes the file
    asynchronously, after `finish()` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        records = _read_wandb_records(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"no exit record in {run_dir} after {timeout} s"
        time.sleep(0.1)


def _wandb_history(run_dir: str) -> dict[int, dict]:
    history = {}
    for record in _finished_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            items = {
                (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                for item in record.history.item
            }
            history[items["_step"]] = items
    return history


def test_wandb_writer_offline_files_hold_scalars_config_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import glob

    from axlearn.common.summary_writer import WANDB_RUN_ID_FILE, WandBWriter

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = WandBWriter.default_config().set(name="wandb", dir=str(tmp_path), exp_name="run-a")

    class Thing(Configurable):
        @config_class
        class Config(Configurable.Config):
            value: int = 3  # A field.

    writer = cfg.instantiate(parent=None)
    writer.log_config(Thing.default_config().set(value=7))
    losses = {0: 4.0, 1: 3.5, 2: 3.25}
    for step, loss in losses.items():
        writer(
            step,
            {
                "loss": jnp.asarray(loss),
                "learner": {"lr": np.float32(0.5 * step)},
                "acc": WeightedScalar(0.25 * step, 8),
                "note": "text is skipped",
            },
        )
    writer.finish()
    run_id = open(tmp_path / WANDB_RUN_ID_FILE, encoding="utf-8").read().strip()
    (run_dir,) = glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{run_id}"))
    history = _wandb_history(run_dir)
    assert sorted(history) == [0, 1, 2]
    for step, loss in losses.items():
        assert history[step]["loss"] == pytest.approx(loss)
        assert history[step]["learner/lr"] == pytest.approx(0.5 * step)
        assert history[step]["acc"] == pytest.approx(0.25 * step)
        assert "note" not in history[step]
    config = {}
    for record in _finished_records(run_dir):
        if record.WhichOneof("record_type") == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    dump = dict(
        line.split(": ", 1)
        for line in Thing.default_config().set(value=7).debug_string().split("\n")
    )
    assert config["value"] == "7"
    assert {k: config[k] for k in dump} == dump

    # A restarted writer with the same dir resumes the same run id. W&B names an offline
    # run's directory by its start time in whole seconds, so a resumption started within the
    # same second would write into the first run's directory; a real restart never does.
    time.sleep(1.0 - time.time() % 1.0 + 0.05)
    writer2 = cfg.instantiate(parent=None)
    writer2(3, {"loss": 3.0})
    assert writer2.run.id == run_id
    writer2.finish()
    # The resumed run's records (in a new offline-run dir of the same id) hold step 3.
    deadline = time.monotonic() + 60
    while True:
        runs = glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{run_id}"))
        resumed = [h for h in map(_wandb_history, runs) if 3 in h]
        if resumed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert resumed and resumed[0][3]["loss"] == pytest.approx(3.0)


def test_wandb_writer_rejects_bad_mode(tmp_path):
    pytest.importorskip("wandb")
    from axlearn.common.summary_writer import WandBWriter

    cfg = WandBWriter.default_config().set(name="wandb", dir=str(tmp_path), mode="sometimes")
    with pytest.raises(ValueError, match="wandb.mode must be online, offline or disabled"):
        cfg.instantiate(parent=None)


def test_jsonl_full_disk_leaves_whole_lines_and_a_torn_tail_is_cut(tmp_path, monkeypatch, caplog):
    """Case 2: a full disk mid-append leaves no half line and the error names the file; a torn
    tail left by an earlier process is cut with a warning before the next append, so every line
    of the resumed file is valid JSON (and `axlearn compare` reads it)."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import run_comparison, summary_writer

    d = str(tmp_path)
    path = os.path.join(d, "metrics.jsonl")
    writer = _writer(JsonlWriter.default_config().set(dir=d))
    writer(1, dict(loss=jnp.float32(1.0)))
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(summary_writer.os, "write", full_disk)
    with pytest.raises(OSError, match=f"{path}: cannot append the step 2 record"):
        writer(2, dict(loss=jnp.float32(0.5)))
    monkeypatch.setattr(summary_writer.os, "write", real_write)
    with open(path, encoding="utf-8") as f:
        assert [json.loads(line)["step"] for line in f] == [1]

    # A torn tail from a process killed mid-write: the next writer cuts it, with a warning.
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 2, "loss": 0.')
    resumed = _writer(JsonlWriter.default_config().set(dir=d))
    with caplog.at_level("WARNING"):
        resumed(2, dict(loss=jnp.float32(0.5)))
        resumed(3, dict(loss=jnp.float32(0.25)))
    assert any("torn line" in r.getMessage() and path in r.getMessage() for r in caplog.records)
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 0.25)]

    # A file damaged before this fix (a torn line appended onto) is read, the line skipped.
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 4, "lo{"step": 4, "loss": 0.125}\n{"step": 5, "loss": 0.0625}\n')
    run = run_comparison.load_run(d)
    assert [r["step"] for r in run.records] == [1, 2, 3, 5]
    assert any("metrics.jsonl:4: not valid JSON" in n and "skipped" in n for n in run.notes)


def test_jsonl_torn_record_longer_than_1mib_cuts_only_itself(tmp_path):
    """Issue 48: a torn last record longer than 1 MiB is cut at the last whole line; the records
    of the steps before it stay (it used to truncate the whole file)."""
    path = str(tmp_path / "metrics.jsonl")
    whole = "".join(json.dumps({"step": i, "loss": 1.0 / i}) + "\n" for i in range(1, 6))
    torn = '{"step": 6, "text": "' + "x" * (3 * (1 << 20) + 17)
    with open(path, "w") as f:
        f.write(whole + torn)
    assert cut_torn_tail(path) == len(torn)
    with open(path) as f:
        assert f.read() == whole
    # A file that is one torn record with no newline at all is emptied.
    with open(path, "w") as f:
        f.write(torn)
    assert cut_torn_tail(path) == len(torn)
    assert os.path.getsize(path) == 0


def test_resumed_run_moves_redone_records_aside_one_record_per_step(tmp_path):
    """Issue 55 case 5: after a resume from step 6 of a run that reached step 10, metrics.jsonl
    holds steps 1-12 once each (the resumed run's 7-10); the first attempt's 7-10 are kept in
    metrics.redone.jsonl (was: 14 records for 12 steps, nothing marking which counts)."""
    d = str(tmp_path)
    first = _writer(JsonlWriter.default_config().set(dir=d))
    for step in range(1, 11):
        first(step, dict(loss=jnp.float32(step), attempt="first"))
    resumed = _writer(JsonlWriter.default_config().set(dir=d))
    for step in range(7, 13):
        resumed(step, dict(loss=jnp.float32(step), attempt="resumed"))
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == list(range(1, 13))
    assert [r["attempt"] for r in records] == ["first"] * 6 + ["resumed"] * 6
    with open(os.path.join(d, "metrics.redone.jsonl"), encoding="utf-8") as f:
        redone = [json.loads(line) for line in f]
    assert [(r["step"], r["attempt"]) for r in redone] == [(s, "first") for s in range(7, 11)]
