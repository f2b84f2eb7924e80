"""A small GPT experiment written against AXLearn's public API, in `c4_trainer` style.

It uses only names an AXLearn user writes (imports as in AXLearn's c4_trainer.py and fuji.py);
the data and vocabulary are the ones shipped with the package (the embedded corpus and its 4k
sentencepiece model) so that it trains anywhere. tests/experiments/text/gpt/test_axlearn_style.py
dumps, instantiates and trains it unchanged.
"""

from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    GroupedQueryAttention,
    KVCache,
    RepeatedTransformerLayer,
    RoFormerQKVLinear,
)
from axlearn.common.config import InstantiableConfig, TrainerConfigFn, config_for_function
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.input_lm import lm_text_preprocessor
from axlearn.common.layers import RMSNorm
from axlearn.common.trainer_config_modifier import ChainConfigModifier, MeshShapeModifier
from axlearn.common.utils import get_data_dir
from axlearn.experiments.text.common import DataMixtureComponent, vocab
from axlearn.experiments.text.gpt.common import (
    EVAL_EVERY_N_STEPS,
    STEP_DTYPE,
    adamw_decoupled_learner_config,
    evaler_config_dict,
    get_trainer_config_fn,
    make_config_name,
    mesh_shape_from_axes,
    mixture_train_input_source,
    model_config,
    scaled_hidden_dim,
    tfds_input,
)

_DATASET = "python_docs:1.0.0"
_VOCAB = "bpe_4k_python_docs.model"
_VOCAB_SIZE = 4096
_MAX_LEN = 64


def _vocab_cfg() -> InstantiableConfig:
    return config_for_function(vocab).set(sentencepiece_model_name=_VOCAB)


def _train_input_source() -> InstantiableConfig:
    source_cfg = config_for_function(mixture_train_input_source).set(
        data_mixture_components=[
            DataMixtureComponent(name=_DATASET, split="train", shuffle_buffer_size=16, weight=1.0)
        ],
        vocab_cfg=_vocab_cfg(),
        max_sequence_length=_MAX_LEN,
        preprocessor=config_for_function(lm_text_preprocessor).set(max_padding_fraction=0.5),
    )
    if get_data_dir() == "FAKE":
        source_cfg.preprocessor.shuffle_buffer_size = 0
    return source_cfg


def _model_cfg() -> InstantiableConfig:
    qkv = RoFormerQKVLinear.default_config().set(
        input_linear=FusedGroupedQKVLinear.default_config().set(num_kv_heads=2),
        rotary_value=False,
    )
    return model_config(
        hidden_dim=64,
        num_heads=4,
        num_layers=2,
        vocab_size=_VOCAB_SIZE,
        activation_fn=("nn.silu", "linear"),
        ffn_dim=scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16),
        normalization=RMSNorm.default_config().set(eps=1e-5, forward_dtype=None),
        stack_cfg=RepeatedTransformerLayer.default_config(),
        emb_cfg=TransformerTextEmbeddings.default_config().set(pos_emb=None),
        attention_cfg=GroupedQueryAttention.default_config(),
        attention_qkv_linear=qkv,
        attention_kv_cache=KVCache.default_config().set(cache_dtype=STEP_DTYPE),
    )


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """Returns a mapping from trainer config names to TrainerConfigFn's."""
    max_step = 100
    evalers = evaler_config_dict(
        {
            "validation": config_for_function(tfds_input).set(
                dataset_name=_DATASET,
                split="validation",
                is_training=False,
                vocab_cfg=_vocab_cfg(),
                max_sequence_length=_MAX_LEN,
            )
        }
    )
    return {
        make_config_name(arch="axlearn-style", model_size="tiny"): get_trainer_config_fn(
            model_cfg=_model_cfg(),
            learner_cfg=adamw_decoupled_learner_config(
                peak_lr=3e-3, weight_decay=0.01, lr_warmup_steps=10, max_step=max_step
            ),
            max_step=max_step,
            train_batch_size=16,
            train_input_source=_train_input_source(),
            evalers=evalers,
            mesh_shape=mesh_shape_from_axes(data=-1),
            mesh_rules=(
                (
                    "cpu-fsdp",
                    ChainConfigModifier.default_config().set(
                        config_modifiers=[
                            MeshShapeModifier.default_config().set(
                                mesh_shape=mesh_shape_from_axes(fsdp=-1)
                            )
                        ]
                    ),
                ),
            ),
            eval_every_n_steps=EVAL_EVERY_N_STEPS,
        )
    }
