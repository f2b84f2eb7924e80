"""Tests for `axlearn hf export` / `axlearn hf import` (axlearn/cli/hf.py) on a trained run.

The run (tests/cli/conftest.py) is a 1-layer GPT without QK-norm, i.e. a Llama. Export must give
a directory that `transformers` loads with the same logits as our model; import of that directory
must give a checkpoint that the trainer restores bit-exactly and fine-tunes from.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers

from axlearn.common.hf_checkpoint import SAFETENSORS_INDEX_FILE, export_trainer_dir
from axlearn.common.inference import InferenceRunner, sentencepiece_model_file
from tests.common import trainer_test_utils as tu
from tests.trained_run import LLAMA_OVERRIDES, MODULE, _run, axlearn


def _hf_logits(hf_dir: str, ids: np.ndarray) -> np.ndarray:
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_same_logits(trained_dir, tmp_path):
    out = str(tmp_path / "hf")
    proc = axlearn(
        "hf", "export", f"--trainer_dir={trained_dir}", f"--output={out}", f"--module={MODULE}"
    )
    assert "Exported step 6" in proc.stdout
    assert {"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"} <= set(
        os.listdir(out)
    )
    runner = InferenceRunner.from_trainer_dir(trained_dir, evalers=[], module=MODULE)
    runner.restore()
    ids = np.random.default_rng(0).integers(2, 4096, size=(8, 24))  # 8 rows: one per device.
    ours = runner.predict(ids)
    theirs = _hf_logits(out, ids)
    assert np.abs(ours - theirs).max() < 1e-4, np.abs(ours - theirs).max()

    # Sharded: several files and the index that from_pretrained follows; same logits.
    sharded = str(tmp_path / "hf_sharded")
    step, written = export_trainer_dir(trained_dir, sharded, max_shard_bytes=200_000, module=MODULE)
    assert step == 6 and SAFETENSORS_INDEX_FILE in written
    shards = [w for w in written if w.startswith("model-")]
    assert len(shards) > 1
    with open(os.path.join(sharded, SAFETENSORS_INDEX_FILE), encoding="utf-8") as f:
        assert sorted(set(json.load(f)["weight_map"].values())) == sorted(shards)
    np.testing.assert_array_equal(_hf_logits(sharded, ids), theirs)

    # The tokenizer files give the experiment's sentencepiece ids.
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(
        model_file=sentencepiece_model_file(runner.trainer_config)
    )
    text = "The Python interpreter reads a file."
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(text)["input_ids"] == sp.encode(text)


@pytest.mark.slow
def test_import_restores_exactly_and_fine_tunes(trained_dir, tmp_path):
    out = str(tmp_path / "hf")
    export_trainer_dir(trained_dir, out, module=MODULE)
    new_dir = str(tmp_path / "finetune")
    proc = axlearn(
        "hf",
        "import",
        out,
        f"--module={MODULE}",
        "--config=gpt-tiny-eval",
        f"--trainer_dir={new_dir}",
        *LLAMA_OVERRIDES,
    )
    assert "step_00000000" in proc.stdout and "launch_trainer_main" in proc.stdout
    # 5 fine-tuning steps from the imported checkpoint.
    _run(
        [
            "-m",
            "axlearn.common.launch_trainer_main",
            f"--module={MODULE}",
            "--config=gpt-tiny-eval",
            f"--trainer_dir={new_dir}",
            "--jax_backend=cpu",
            "--config_override=max_step=5",
            "--config_override=checkpointer.save_policy.max_step=5",
            *LLAMA_OVERRIDES,
        ]
    )
    records = tu.read_metrics(new_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    # The imported step-0 parameters are the trained run's, bit for bit.
    original = InferenceRunner.from_trainer_dir(trained_dir, evalers=[], module=MODULE)
    original.restore(6)
    imported = InferenceRunner.from_trainer_dir(new_dir, evalers=[], module=MODULE)
    assert imported.restore(0) == 0
    for a, b in zip(jax_leaves(original.params), jax_leaves(imported.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Fine-tuning starts from the trained model: its first loss is the trained run's level, far
    # below a fresh model's ~ln(4096) = 8.3.
    trained_loss = tu.read_metrics(trained_dir)[-1]["loss"]
    assert records[0]["loss"] < 0.5 * (trained_loss + np.log(4096))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_export_refuses_a_model_with_qk_norm_naming_the_field(tmp_path):
    from axlearn.common.hf_checkpoint import HfConversionError, llama_config
    from axlearn.experiments.text.gpt.tiny import tiny_trainer_config

    with pytest.raises(HfConversionError, match="query_scale.norm is set"):
        llama_config(tiny_trainer_config().model, tied=True)


def test_import_errors_name_the_problem(tmp_path):
    proc = axlearn(
        "hf",
        "import",
        str(tmp_path),
        f"--module={MODULE}",
        "--config=gpt-tiny-eval",
        f"--trainer_dir={tmp_path / 'new'}",
        check=False,
    )
    assert proc.returncode == 1 and "config.json does not exist" in proc.stderr
    # Issue 29 case 13: an import into a model with QK-norm speaks of importing, not exporting,
    # and names the overrides that make the experiment's model a Llama.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    proc = axlearn(
        "hf",
        "import",
        str(tmp_path),
        f"--module={MODULE}",
        "--config=gpt-tiny-eval",
        f"--trainer_dir={tmp_path / 'new'}",
        check=False,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Llama weights cannot be imported" in last, proc.stderr
    assert "export" not in last and "Traceback" not in proc.stderr
    for override in LLAMA_OVERRIDES:
        assert override in last, (override, last)
