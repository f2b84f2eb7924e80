"""Tests axlearn/experiments/text/gpt/c4_trainer.py (and fuji.py) against AXLearn's published data.

References: AXLearn's current golden config dumps (a sample of 13 configs, plus `_init.txt` and
`_regularizer.txt` examples; tests/testdata/axlearn_goldens, see its README) and older
`_init.txt`/`_regularizer.txt` dumps (tests/testdata/axlearn_dumps).
"""

from __future__ import annotations

import collections
import functools
import os
import re

import jax
import numpy as np
import pytest

from axlearn.common.experiment_registry import UnknownTrainerConfigError, get_named_trainer_config
from axlearn.common.utils import flatten_items
from axlearn.experiments.text.gpt import c4_trainer, fuji
from axlearn.experiments.text.gpt.fuji_tiny import tiny_model_kwargs, tiny_sources

_REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
)
_DUMPS = os.path.join(_REPO, "tests", "testdata", "axlearn_dumps")
_GOLDENS = os.path.join(_REPO, "tests", "testdata", "axlearn_goldens")
_DIFFERENCES_DOC = os.path.join(_REPO, "docs", "axlearn_differences.md")


def _sample_names() -> list[str]:
    """The config names of AXLearn's current golden sample (its `<name>.txt` files)."""
    return sorted(
        f[: -len(".txt")]
        for f in os.listdir(_GOLDENS)
        if f.endswith(".txt") and not f.endswith(("_init.txt", "_regularizer.txt"))
    )


@functools.cache
def _configs():
    return c4_trainer.named_trainer_configs()


# fuji-{1B,3B,7B,70B}-v3 and their -flash and -single-host variants.
V3_VARIANTS = [
    f"fuji-{size}-v3{variant}"
    for size in ("1B", "3B", "7B", "70B")
    for variant in ("", "-flash", "-single-host")
    if not (size == "70B" and variant == "-single-host")  # AXLearn has no 70B single-host.
]

# The sample's configs that are registered here (the others: docs/axlearn_differences.md).
MATCHED = [name for name in _sample_names() if name in _configs()]


def match_ratio(ours: list[str], theirs: list[str]) -> tuple[float, list[str], list[str]]:
    """(identical lines / union of both files' lines, only ours, only theirs), as multisets."""
    a, b = collections.Counter(ours), collections.Counter(theirs)
    common = sum((a & b).values())
    union = sum((a | b).values())
    return common / union, sorted((a - b).elements()), sorted((b - a).elements())


def test_match_ratio_counts_the_union():
    ratio, only_ours, only_theirs = match_ratio(["x: 1", "y: 2", "z: 3"], ["x: 1", "y: 3"])
    assert ratio == pytest.approx(1 / 4)  # Union: x, y:2, y:3, z.
    assert only_ours == ["y: 2", "z: 3"] and only_theirs == ["y: 3"]


def test_sample_coverage():
    """Every fuji v3 dump of the sample that is not fp8/tiktoken is registered and compared."""
    assert {
        "fuji-1B-v3",
        "fuji-70B-v3",
        "fuji-70B-v2",
        "fuji-7B-v1-single-host",
        "fuji-golden-run-test-v3",
        "fuji-test-v3-flash",
    } <= set(MATCHED)


@pytest.mark.parametrize("name", MATCHED)
def test_dump_matches_axlearn(name):
    ours = _configs()[name]().debug_string().splitlines()
    with open(os.path.join(_GOLDENS, f"{name}.txt"), encoding="utf-8") as f:
        theirs = f.read().splitlines()
    ratio, only_ours, only_theirs = match_ratio(ours, theirs)
    assert ratio >= 0.98, (ratio, only_ours, only_theirs)
    # Every remaining line is listed in docs/axlearn_differences.md (with its reason there).
    with open(_DIFFERENCES_DOC, encoding="utf-8") as f:
        doc = f.read()
    missing = [line for line in only_ours + only_theirs if _doc_form(line) not in doc]
    assert not missing, f"{name}: lines not in docs/axlearn_differences.md: {missing}"


def _doc_form(line: str) -> str:
    """A dump line as the differences doc lists it: the mesh-rule index is written `[*]`."""
    return re.sub(r"^mesh_rules\[\d+\]", "mesh_rules[*]", line)


def test_405b_rules_match_axlearns_405b_dump():
    """AXLearn's fuji-405B-v3-fp8 has no GPU rules (where its FP8 modifier would go), so its dump
    is fuji-405B-v3's: ours matches it but for the documented attention_mask line, including the
    v5p rule and the tpu-7x-.* rule with its splash block sizes."""
    from axlearn.common.mesh_resolution import resolve_mesh

    ours = _configs()["fuji-405B-v3"]().debug_string().splitlines()
    with open(os.path.join(_GOLDENS, "fuji-405B-v3-fp8.txt"), encoding="utf-8") as f:
        theirs = f.read().splitlines()
    ratio, only_ours, only_theirs = match_ratio(ours, theirs)
    assert (only_ours, only_theirs) == (["model.decoder.attention_mask: None"], [])
    cfg, res = resolve_mesh(_configs()["fuji-405B-v3"](), mesh_selector="tpu-7x-256")
    assert (res.rule, res.rule_index, cfg.mesh_shape) == ("tpu-7x-.*", 1, (1, -1, 1, 256, 1, 1))


def test_regularizer_dump_equals_axlearn_current():
    from axlearn.common import golden_config

    with open(os.path.join(_GOLDENS, "fuji-7B-v3_regularizer.txt"), encoding="utf-8") as f:
        theirs = f.read()
    assert golden_config.regularizer_text(_configs()["fuji-7B-v3"]()) == theirs


def test_registered_v3_names():
    names = set(_configs())
    for size in ("1B", "3B", "7B"):
        for suffix in ("", "-flash", "-single-host", "-flash-single-host"):
            assert f"fuji-{size}-v3{suffix}" in names
    assert {"fuji-70B-v3", "fuji-70B-v3-flash", "fuji-405B-v3", "fuji-test-v3"} <= names
    assert {"fuji-7B-v1", "fuji-70B-v2-flash", "fuji-7B-v2-single-host"} <= names
    assert "fuji-70B-v3-single-host" not in names


def test_tiktoken_configs_use_llama3_tokenizer():
    from axlearn.experiments.text.gpt.vocabulary_fuji_v3 import FujiV3Vocabulary

    names = set(_configs())
    assert {f"fuji-{s}-v3-tiktoken{f}" for s in ("1B", "3B", "8B", "70B", "405B")
            for f in ("", "-flash")} <= names  # fmt: skip
    cfg = _configs()["fuji-8B-v3-tiktoken"]()
    assert cfg.input.source.vocab_cfg.klass is FujiV3Vocabulary
    assert cfg.input.source.vocab_cfg.filename == "Llama-3-tokenizer.json"
    decoder = cfg.model.decoder
    assert (decoder.vocab_size, decoder.pad_token_id, decoder.eos_token_id) == (
        128256,
        128004,
        128001,
    )
    assert decoder.lm_head is not None and decoder.transformer.num_layers == 32
    # Llama 3 8B: FFN 3.5 x 4096 rounded up to 256 = 14336.
    model = cfg.model.clone(name="model").instantiate(parent=None)
    params = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    layer = params["decoder"]["transformer"]["repeat"]["layer"]
    assert layer["feed_forward"]["linear1_0"]["weight"].shape == (32, 4096, 14336)
    total = sum(int(np.prod(x.shape)) for _, x in flatten_items(params))
    # Hand-summed: embedding + LM head + 32 x (2 norms + qkv (48 heads) + o + 3 ffn) + norm.
    assert (
        total
        == 2 * 128256 * 4096
        + 32 * (2 * 4096 + 4096 * 48 * 128 + 4096 * 32 * 128 + 3 * 4096 * 14336)
        + 4096
        == 8_030_261_248
    )  # Llama 3 8B's parameter count.


def test_fp8_variants():
    """Every non-test size has "-fp8" (and 1B/3B/7B/8B "-fp8-single-host"): FP8ConfigModifier
    (history 128) appended to the chains of its a3/a4/p5/p4de GPU rules, nothing else changed."""
    from axlearn.common.trainer_config_modifier import FP8ConfigModifier

    names = set(_configs())
    bases = [n for n in names if "fuji-" in n and not n.endswith(("-fp8", "-single-host"))]
    bases = [n for n in bases if "test" not in n]
    assert len(bases) == 28
    for base in bases:
        assert f"{base}-fp8" in names
    assert len([n for n in names if n.endswith("-fp8-single-host")]) == 16
    assert "fuji-test-v3-fp8" not in names and "fuji-70B-v3-fp8-single-host" not in names
    base, fp8 = _configs()["fuji-7B-v3-flash"](), _configs()["fuji-7B-v3-flash-fp8"]()
    changed = []
    for (selector, rule), (_, fp8_rule) in zip(base.mesh_rules, fp8.mesh_rules):
        extra = list(getattr(fp8_rule, "config_modifiers", []))[
            len(getattr(rule, "config_modifiers", [])) :
        ]
        if extra:
            assert extra[0].klass is FP8ConfigModifier
            assert extra[0].fp8_amax_history_length == 128
            changed.append(selector)
    assert changed == [
        "gpu-(a3-highgpu-8g|a3-megagpu-8g|a3-ultragpu-8g)-(256|512|1024)",
        "gpu-(a4-highgpu-8g)-(256|512|1024)",
    ]
    fp8.mesh_rules = base.mesh_rules
    assert fp8.debug_string() == base.debug_string()
    single = _configs()["fuji-8B-v3-tiktoken-fp8-single-host"]()
    assert single.input.input_dispatcher.global_logical_batch_size == 2048 // 128


def test_values_as_axlearn_states_them():
    cfg = _configs()["fuji-7B-v3"]()
    # VOCAB_SIZE[V3] = 128 * 1024; 128256 is V3_TIKTOKEN's.
    assert cfg.model.decoder.vocab_size == 131072 == fuji.VOCAB_SIZE[fuji.Version.V3]
    assert fuji.VOCAB_SIZE[fuji.Version.V3_TIKTOKEN] == 128256
    # 16M tokens per batch of 8192 tokens = 2048 sequences; 15T tokens = 983040 steps.
    assert cfg.input.input_dispatcher.global_logical_batch_size == 2048
    assert cfg.max_step == 15 * 1024**4 // (16 * 1024**2) == 983040
    assert cfg.learner.optimizer.args[1].update_schedule.max_step == 983040
    assert cfg.input.source.replace_newlines_with == "<n>"
    for evaler in cfg.evalers.values():
        assert evaler.input.source.replace_newlines_with == "\n"
    assert cfg.evalers["train"].input.source.split == "train[:8192]"
    single = _configs()["fuji-7B-v3-single-host"]()
    assert single.input.input_dispatcher.global_logical_batch_size == 2048 // 128


def test_unknown_fuji_variant_lists_registered_names():
    with pytest.raises(UnknownTrainerConfigError) as e:
        get_named_trainer_config("fuji-13B-v3", config_module="text.gpt.c4_trainer")
    message = str(e.value)
    assert "fuji-13B-v3" in message and "fuji-7B-v3" in message  # A close name suggested.
    assert "`axlearn config list --module=text.gpt.c4_trainer` lists its 109 configs" in message


def _init_dump_count(name: str, *, num_layers: int, dim: int) -> int:
    """Parameters summed from AXLearn's `<name>_init.txt` (per-layer shapes x num_layers)."""
    total = 0
    with open(os.path.join(_DUMPS, f"{name}_init.txt"), encoding="utf-8") as f:
        for line in f:
            path = line.split(":", 1)[0]
            match = re.search(r"shape=[\[(]([0-9, ]+)[\])]", line)
            size = int(np.prod([int(x) for x in match.group(1).split(",")])) if match else dim
            total += size * (num_layers if "/repeat/layer/" in path else 1)
    return total


# Hand-summed: embedding (+ untied LM head) + layers x (2 norms + qkv + o + 3 ffn) + output norm.
_7B = 131072 * 4096 + 32 * (2 * 4096 + 4096 * 48 * 128 + 4096 * 32 * 128 + 3 * 4096 * 11008) + 4096
_70B = (
    2 * 131072 * 8192
    + 80 * (2 * 8192 + 8192 * 80 * 128 + 8192 * 64 * 128 + 3 * 8192 * 28672)
    + 8192
)


@pytest.mark.parametrize(
    "name,num_layers,dim,expected",
    [("fuji-7B-v3", 32, 4096, _7B), ("fuji-70B-v3", 80, 8192, _70B)],
)
def test_parameter_count_equals_axlearn_init_dump(name, num_layers, dim, expected):
    from axlearn.common import golden_config

    assert (_7B, _70B) == (6_207_836_160, 70_599_843_840)
    cfg = _configs()[name]()
    model = cfg.model.clone(name="model").instantiate(parent=None)
    params = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    ours = sum(int(np.prod(x.shape)) for _, x in flatten_items(params))
    assert ours == _init_dump_count(name, num_layers=num_layers, dim=dim) == expected
    # `axlearn config dump --init` of the config is AXLearn's published _init.txt, line for line
    # (fuji-7B-v3's also as AXLearn's current sample has it).
    with open(os.path.join(_DUMPS, f"{name}_init.txt"), encoding="utf-8") as f:
        assert golden_config.init_text(cfg).splitlines() == f.read().splitlines()
    current = os.path.join(_GOLDENS, f"{name}_init.txt")
    if os.path.exists(current):
        with open(current, encoding="utf-8") as f:
            assert golden_config.init_text(cfg).splitlines() == f.read().splitlines()


def _tiny_equivalent(name: str, trainer_dir: str, *, max_step: int = 3):
    """The config `name` with fuji-tiny-v3's model shapes and embedded-corpus inputs (keeping
    the config's attention kind (grouped-query or multi-head), LM-head tying and repeated
    stack)."""
    from axlearn.common.attention import RepeatedTransformerLayer

    cfg = _configs()[name]()
    qkv = cfg.model.decoder.transformer.layer.self_attention.attention.input_linear
    grouped = getattr(getattr(qkv, "input_linear", qkv), "num_kv_heads", None) is not None
    kwargs = dict(
        tiny_model_kwargs(),
        flash_attention="flash" in name,
        shared_lm_head=cfg.model.decoder.lm_head is None,
        stack_cfg=RepeatedTransformerLayer.default_config(),
    )
    if not grouped:  # Multi-head attention (v1, v2 below 70B).
        kwargs["num_kv_heads"] = None
    cfg.model = fuji.model_config(**kwargs).set(name="model")
    train, evals = tiny_sources(max_sequence_length=32)
    batch = min(cfg.input.input_dispatcher.global_logical_batch_size, 16)
    cfg.input.source = train
    cfg.input.input_dispatcher.global_logical_batch_size = batch
    # The "validation" evaler (per-feed batching like training), on 8 documents, at the end.
    evaler = cfg.evalers["validation"]
    evaler.input.source = evals["validation"].set(split="validation[:8]")
    evaler.input.input_dispatcher.global_logical_batch_size = batch
    evaler.eval_policy.set(n=max_step, max_step=max_step)
    cfg.evalers = {"validation": evaler}
    cfg.set(name="trainer", dir=trainer_dir, max_step=max_step, mesh_shape=(1, -1, 1, 1, 1, 1))
    cfg.learner.optimizer.args[1].update_schedule.max_step = max_step
    cfg.learner.optimizer.args[1].update_schedule.warmup_steps = 1
    cfg.checkpointer.save_policy.max_step = max_step
    return cfg


@pytest.mark.slow
# One run per structural variant (compiles dominate): FlashAttention + single-host batch, and
# grouped-query attention with an untied LM head (also with FlashAttention, the tiktoken 8B);
# every matched config builds (test below).
@pytest.mark.parametrize(
    "name", ["fuji-7B-v3-flash-single-host", "fuji-70B-v3", "fuji-8B-v3-tiktoken-flash"]
)
def test_tiny_equivalent_trains(name, tmp_path):
    cfg = _tiny_equivalent(name, str(tmp_path))
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    assert output is not None and np.isfinite(float(output["loss"]))
    # The evaluation at the last step wrote its summaries.
    assert os.listdir(os.path.join(str(tmp_path), "summaries", "validation"))


def test_every_matched_config_builds_its_tiny_equivalent(tmp_path):
    for name in V3_VARIANTS:
        cfg = _tiny_equivalent(name, str(tmp_path / name))

        # Mesh rules are AXLearn's and resolve on the tiny config too.
        def rules(c):
            return [x for x in c.debug_string().splitlines() if x.startswith("mesh_rules")]

        assert rules(cfg) == rules(_configs()[name]())
        model = cfg.model.instantiate(parent=None)
        params = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
        assert params["decoder"]["emb"]["token_emb"]["weight"].shape == (4096, 64)


def test_fake_data_keeps_the_dispatched_batch():
    """--data_dir=FAKE (and AOT) replace the inputs by FakeLmInput with the logical batch."""
    from axlearn.common.input_fake import replace_inputs_with_fake

    cfg = replace_inputs_with_fake(_configs()["fuji-7B-v3-single-host"]())
    assert (cfg.input.global_batch_size, cfg.input.source_length) == (16, 8192)
    assert cfg.evalers["validation"].input.global_batch_size == 16


def test_launcher_selectors_pick_axlearns_fuji_rules():
    """The launcher's mesh selectors (mesh_resolution) select AXLearn's rules and apply them."""
    from axlearn.common.mesh_resolution import resolve_mesh

    cfg, res = resolve_mesh(_configs()["fuji-7B-v3"](), mesh_selector="tpu-v5litepod-256")
    assert (res.rule, cfg.mesh_shape) == ("tpu-v5litepod-256", (1, -1, 1, 256, 1, 1))
    assert cfg.learner.forward_fn_transformation.steps == 4  # GradientAccumulationModifier.
    layer = cfg.model.decoder.transformer.layer
    assert layer.remat_spec.policy is fuji.offload_dots_saveable_policy
    cfg, res = resolve_mesh(_configs()["fuji-7B-v3-flash"](), mesh_selector="gpu-a4-highgpu-8g-256")
    attention = cfg.model.decoder.transformer.layer.self_attention.attention
    assert (res.rule_index, attention.gpu_block_size, cfg.mesh_shape[3]) == (8, 64, 8)
    cfg, res = resolve_mesh(_configs()["fuji-70B-v3"](), mesh_selector="tpu-v6e-256-4")
    attention = cfg.model.decoder.transformer.layer.self_attention.attention
    assert res.rule == "tpu-v6e-256-(4|8)" and cfg.mesh_shape == (1, -1, 1, 256, 1, 1)
    assert "tpu_block_size" not in attention  # V6eFlashConfigModifier: no flash layer, no change.
    # AXLearn's TPU 7x rules (Ironwood, 2 devices per chip: tpu-7x-128 has 128 devices).
    cfg, res = resolve_mesh(_configs()["fuji-70B-v3-flash"](), mesh_selector="tpu-7x-128")
    layer = cfg.model.decoder.transformer.layer
    assert (res.rule, res.rule_index, cfg.mesh_shape) == ("tpu-7x-128", 2, (1, -1, 1, 128, 1, 1))
    assert layer.self_attention.attention.tpu_block_size == 2048  # V7xFlashConfigModifier.
    policy = layer.remat_spec.policy
    assert (policy.names_which_can_be_saved, policy.names_which_can_be_offloaded) == (
        ".*[kqv]_proj",
        ".*input",
    )
    cfg, res = resolve_mesh(_configs()["fuji-70B-v3"](), mesh_selector="tpu-7x-256")
    policy = cfg.model.decoder.transformer.layer.remat_spec.policy
    assert (res.rule_index, policy.names_which_can_be_saved) == (3, None)


def test_modifier_naming_a_missing_path_fails_naming_it():
    from axlearn.common.attention import GroupedQKVLinear
    from axlearn.common.trainer_config_modifier import ModuleConfigModifier, RematSpecModifier

    cfg = _configs()["fuji-7B-v3"]()
    typo = "model.decoder.transformer.layer.self_attention.attention.input_linear.input_linaer"
    modifier = ModuleConfigModifier.default_config().set(
        target_config=typo, modification=GroupedQKVLinear.default_config()
    )
    with pytest.raises(ValueError, match=re.escape(typo) + ".*no field 'input_linaer'"):
        modifier.instantiate()(cfg)
    remat = RematSpecModifier.default_config().set(remat_policies={"model.decoder.layers": None})
    with pytest.raises(
        ValueError, match=r"model\.decoder\.layers: .*Decoder.*has no field 'layers'"
    ):
        remat.instantiate()(cfg)
