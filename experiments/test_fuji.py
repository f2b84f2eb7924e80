"""The Fuji v3 configs (axlearn.experiments.text.gpt.c4_trainer) against AXLearn's published sizes.

Reference shapes: AXLearn's golden `_init.txt` dumps, which list every parameter with its
per-layer shape (apple/axlearn, axlearn/experiments/testdata/axlearn.experiments.text.gpt.
c4_trainer/fuji-7B-v3_init.txt, fuji-70B-v3_init.txt, and the 1B/3B ones). The v3 vocabulary is
AXLearn's `fuji.py` VOCAB_SIZE[V3] = 128 * 1024 = 131072 rows, as those dumps list (128256 is
the separate V3_TIKTOKEN version's vocabulary; some older 1B/70B-flash `_init.txt` versions
predate the change and list 128256).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from axlearn.common.utils import flatten_items
from axlearn.experiments.text.gpt import c4_trainer, fuji

V = 131072
_LAYER = "decoder/transformer/repeat/layer/"


def _published(dim, qkv_heads, heads, head_dim, ffn, untied=False):
    shapes = {
        "decoder/emb/token_emb/weight": (V, dim),
        _LAYER + "self_attention/norm/scale": (dim,),
        _LAYER + "self_attention/attention/i_proj/i_proj/qkv_proj/weight": (
            dim,
            qkv_heads,
            head_dim,
        ),
        _LAYER + "self_attention/attention/o_proj/weight": (dim, heads, head_dim),
        _LAYER + "feed_forward/norm/scale": (dim,),
        _LAYER + "feed_forward/linear1_0/weight": (dim, ffn),
        _LAYER + "feed_forward/linear1_1/weight": (dim, ffn),
        _LAYER + "feed_forward/linear2/weight": (ffn, dim),
        "decoder/output_norm/scale": (dim,),
    }
    if untied:
        shapes["decoder/lm_head/weight"] = (V, dim)
    return shapes


# (num_layers, published per-layer shapes).
PUBLISHED = {
    "fuji-1B-v3": (16, _published(2048, 48, 32, 64, 8192)),
    "fuji-3B-v3": (28, _published(3072, 40, 24, 128, 8192)),
    "fuji-7B-v3": (32, _published(4096, 48, 32, 128, 11008)),
    "fuji-70B-v3": (80, _published(8192, 80, 64, 128, 28672, untied=True)),
}
# Parameter counts of the published shapes (hand-summed).
COUNTS = {
    "fuji-1B-v3": 1_241_581_568,
    "fuji-3B-v3": 3_221_400_576,
    "fuji-7B-v3": 6_207_836_160,
    "fuji-70B-v3": 70_599_843_840,
}


def _abstract_params(name):
    cfg = c4_trainer.named_trainer_configs()[name]()
    model = cfg.model.clone(name="model").instantiate(parent=None)
    return cfg, jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_shapes_and_counts_match_axlearn(name):
    num_layers, published = PUBLISHED[name]
    _, params = _abstract_params(name)
    ours = {path: tuple(x.shape) for path, x in flatten_items(params)}
    expected = {
        path: ((num_layers, *shape) if path.startswith(_LAYER) else shape)
        for path, shape in published.items()
    }
    assert ours == expected
    count = sum(int(np.prod(s)) for s in ours.values())
    published_count = sum(
        int(np.prod(s)) * (num_layers if p.startswith(_LAYER) else 1) for p, s in published.items()
    )
    assert count == published_count == COUNTS[name]


def test_trainer_settings_follow_axlearn():
    cfg, _ = _abstract_params("fuji-7B-v3")
    # 16M tokens per batch of 8192-token sequences; 15T tokens.
    assert cfg.input.input_dispatcher.global_logical_batch_size == 2048
    assert cfg.max_step == 15 * 1024**4 // (16 * 1024**2)
    assert cfg.mesh_shape == (1, -1, 1, 8, 1, 1)
    assert dict(cfg.mesh_rules)["tpu-v4-(1024|2048)"] == (1, -1, 1, 16, 1, 1)
    assert cfg.batch_axis_names == ("data", "expert", "fsdp", "seq")
    attention = cfg.model.decoder.transformer.layer.self_attention.attention
    assert attention.input_linear.rope_pos_emb_layer.theta == 5e5
    assert attention.input_linear.input_linear.num_kv_heads == 8
    adamw = cfg.learner.optimizer.args[1]
    assert (adamw.learning_rate, adamw.weight_decay) == (3e-4, 0.1)
    assert cfg.model.decoder.transformer.layer.remat_spec is not None
    with pytest.raises(NotImplementedError, match="Unknown Fuji model size"):
        fuji.get_trainer_kwargs(
            "13B", vocab_size=fuji.VOCAB_SIZE[fuji.Version.V3], version=fuji.Version.V3
        )


@pytest.mark.slow
def test_tiny_trains_through_the_main_job_command(tmp_path):
    """fuji-tiny-v3 trains on the embedded corpus with the README's main-job command."""
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trainer_dir = str(tmp_path / "fuji-tiny")
    cmd = [
        sys.executable,
        "-m",
        "axlearn.common.launch_trainer_main",
        "--module=text.gpt.fuji",
        "--config=fuji-tiny-v3",
        f"--trainer_dir={trainer_dir}",
        "--jax_backend=cpu",
        "--config_override=max_step=40",
    ]
    env = dict(os.environ, PYTHONPATH=repo_root)
    proc = subprocess.run(
        cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    assert len(losses) == 40
    # From ~ln(4096) = 8.3 at the start; the run must have learned something.
    assert losses[0] > 8.0 and np.mean(losses[-5:]) < losses[0] - 1.0
