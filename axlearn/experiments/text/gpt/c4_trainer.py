"""GPT models on C4 (AXLearn's `axlearn.experiments.text.gpt.c4_trainer`).

Registers AXLearn's Fuji configs (`fuji.trainer_configs`) with C4 inputs: training samples the
`c4/en:3.0.1` train split through `mixture_train_input_source` and `lm_text_preprocessor`; the
"train" (`train[:8192]`) and "validation" evaluations read it with `tfds_input`. Vocabularies are
the C4 sentencepiece models (`bpe_32k_c4.model` for v1/v2, `bpe_128k_c4.model` for v3), and
Llama 3's `Llama-3-tokenizer.json` for the `-tiktoken` configs (`FujiV3Vocabulary`), which are
not shipped: put them in a vocabulary directory (see `axlearn.experiments.text.common.vocab`) and
C4 under `--data_dir`, or train on synthetic data with `--data_dir=FAKE`.

    axlearn config dump --module=text.gpt.c4_trainer --config=fuji-7B-v3
    python -m axlearn.common.launch_trainer_main --module=text.gpt.c4_trainer \\
        --config=fuji-test-v1 --trainer_dir=/tmp/gpt_c4_test --data_dir=FAKE --jax_backend=cpu
"""

from __future__ import annotations

from axlearn.common.config import InstantiableConfig, config_for_class, config_for_function
from axlearn.common.input_lm import lm_text_preprocessor
from axlearn.common.utils import get_data_dir
from axlearn.experiments.text.common import DataMixtureComponent, vocab
from axlearn.experiments.text.gpt import envy, fuji, gspmd, qwen
from axlearn.experiments.text.gpt.common import mixture_train_input_source, tfds_input
from axlearn.experiments.text.gpt.vocabulary_fuji_v3 import FujiV3Vocabulary
from axlearn.experiments.trainer_config_utils import TrainerConfigFn

# Sentencepiece vocabularies trained on c4/en:3.0.1, by vocabulary size.
_SENTENCEPIECE_MODEL_NAME = {
    32 * 1024: "bpe_32k_c4.model",
    128 * 1024: "bpe_128k_c4.model",
    151936: "spm_qwen3_150k.model",  # Qwen3's vocabulary (the qwen3-* configs).
}

# The tokenizer file of the `-tiktoken` configs (Llama 3's tokenizer.json; not shipped).
_TIKTOKEN_FILENAME = "Llama-3-tokenizer.json"

_train_data_mixture_components = [
    DataMixtureComponent(name="c4/en:3.0.1", split="train", shuffle_buffer_size=8192, weight=1.0),
]


def _vocab(vocab_size: int) -> InstantiableConfig:
    if vocab_size == fuji.VOCAB_SIZE[fuji.Version.V3_TIKTOKEN]:
        # Llama 3's tokenizer through tiktoken (the `-tiktoken` configs).
        return config_for_class(FujiV3Vocabulary).set(filename=_TIKTOKEN_FILENAME)
    return config_for_function(vocab).set(
        sentencepiece_model_name=_SENTENCEPIECE_MODEL_NAME[vocab_size]
    )


def _eval_input_sources(
    *, vocab_size: int, max_sequence_length: int
) -> dict[str, InstantiableConfig]:
    return {
        name: config_for_function(tfds_input).set(
            dataset_name="c4/en:3.0.1",
            split=split,
            is_training=False,
            vocab_cfg=_vocab(vocab_size),
            max_sequence_length=max_sequence_length,
        )
        for name, split in (("train", "train[:8192]"), ("validation", "validation"))
    }


def _train_input_source(*, vocab_size: int, max_sequence_length: int) -> InstantiableConfig:
    source_cfg = config_for_function(mixture_train_input_source).set(
        data_mixture_components=_train_data_mixture_components,
        vocab_cfg=_vocab(vocab_size),
        max_sequence_length=max_sequence_length,
        preprocessor=config_for_function(lm_text_preprocessor).set(max_padding_fraction=0.5),
    )
    if get_data_dir() == "FAKE":
        source_cfg.preprocessor.shuffle_buffer_size = 0
    return source_cfg


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn} of the GPT models on C4 (the Fuji family and GSPMD 16B)."""
    return {
        **fuji.trainer_configs(_train_input_source, _eval_input_sources),
        **gspmd.trainer_configs(_train_input_source, _eval_input_sources),
        **envy.trainer_configs(_train_input_source, _eval_input_sources),
        **qwen.trainer_configs(_train_input_source, _eval_input_sources),
    }
