"""Long-context Fuji v3 variants with context parallelism over the "seq" mesh axis (our configs).

`fuji-7B-v3-flash-32k-cp` and `fuji-7B-v3-flash-128k-cp` are `fuji-7B-v3-flash` on C4 (as
`axlearn.experiments.text.gpt.c4_trainer` builds it) with 32768- and 131072-token sequences, the
same tokens per batch (16M), and self-attention split over the "seq" mesh axis in the ring form
(`axlearn.common.flash_attention.context_parallel`): degree 4 at 32k and 16 at 128k by the mesh
rules. The `-ag` variants use the all-gather form.

    axlearn config dump --module=text.gpt.long_context --config=fuji-7B-v3-flash-32k-cp
"""

from __future__ import annotations

from axlearn.common.config import ConfigBase
from axlearn.common.flash_attention.context_parallel import ContextParallelConfig
from axlearn.common.flash_attention.layer import FlashAttention
from axlearn.common.utils import PartitionSpec
from axlearn.experiments.text.gpt import fuji
from axlearn.experiments.text.gpt.c4_trainer import _eval_input_sources, _train_input_source
from axlearn.experiments.text.gpt.common import (
    evaler_config_dict,
    get_trainer_config_fn,
    mesh_shape_from_axes,
)
from axlearn.experiments.trainer_config_utils import TrainerConfigFn

# {name suffix: (sequence length, context-parallel degree of the mesh rules)}.
LONG_CONTEXT_LENGTHS = {"32k": (32768, 4), "128k": (131072, 16)}
# The batch axes of the attention inside the layer (the sequence is over "seq").
_BATCH_AXES = ("data", "expert", "fsdp")


def set_context_parallel(cfg: ConfigBase, *, form: str = "ring", mesh_axis: str = "seq") -> int:
    """Turns on context parallelism in every FlashAttention config of `cfg` (in place).

    Each layer gets `context_parallel=ContextParallelConfig(form=..., mesh_axis=...)` and
    shardings that keep the sequence over `mesh_axis` (batch over the other batch axes, heads
    over "model") instead of AXLearn's heads over ("seq", "model").

    Args:
        cfg: A model or trainer config.
        form: "ring" or "all_gather".
        mesh_axis: The mesh axis the sequence is split over.

    Returns:
        The number of layers changed.
    """
    found = []

    def enter(key, value, children):
        if key == "mesh_rules":
            return None
        if isinstance(value, ConfigBase) and isinstance(getattr(value, "klass", None), type):
            if issubclass(value.klass, FlashAttention):
                found.append(value)
        return children

    cfg.visit(visit_fn=lambda key, value: None, enter_fn=enter)
    seq_spec = PartitionSpec(_BATCH_AXES, mesh_axis, "model", None)
    for attention in found:
        attention.context_parallel = ContextParallelConfig(form=form, mesh_axis=mesh_axis)
        attention.mha_dim_to_partition_spec = {
            "btnh": seq_spec,
            "bsnh": seq_spec,
            "bnts": PartitionSpec(_BATCH_AXES, "model", mesh_axis, None),
        }
        attention.output_dim_to_partition_spec = {
            "btnh": seq_spec,
            "bnts": PartitionSpec(_BATCH_AXES, "model", mesh_axis, None),
        }
    return len(found)


def _long_context_config(suffix: str, *, form: str) -> TrainerConfigFn:
    length, degree = LONG_CONTEXT_LENGTHS[suffix]
    version = fuji.Version.V3
    vocab_size = fuji.VOCAB_SIZE[version]
    kwargs = fuji.get_trainer_kwargs(
        "7B", vocab_size=vocab_size, version=version, flash_attention=True
    )
    kwargs.pop("max_sequence_length")
    set_context_parallel(kwargs["model_cfg"], form=form)
    kwargs["train_batch_size"] = fuji.TOKENS_PER_BATCH[version] // length
    mesh = mesh_shape_from_axes(data=-1, seq=degree, fsdp=8)
    kwargs["mesh_shape"] = mesh
    kwargs["mesh_rules"] = (("tpu-v5p-.*", mesh), ("gpu-.*", mesh))
    sources = dict(vocab_size=vocab_size, max_sequence_length=length)
    return get_trainer_config_fn(
        train_input_source=_train_input_source(**sources),
        evalers=evaler_config_dict(_eval_input_sources(**sources)),
        **kwargs,
    )


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn}: the long-context Fuji v3 7B variants."""
    configs = {}
    for suffix in LONG_CONTEXT_LENGTHS:
        configs[f"fuji-7B-v3-flash-{suffix}-cp"] = _long_context_config(suffix, form="ring")
        configs[f"fuji-7B-v3-flash-{suffix}-cp-ag"] = _long_context_config(
            suffix, form="all_gather"
        )
    return configs
