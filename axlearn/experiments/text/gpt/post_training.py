"""Post-training toy runs: SFT and DPO on the string tasks shipped in axlearn/data/post_training/,
GRPO on the digit-copy task (`axlearn.common.grpo.copy_task`).

    python -m axlearn.common.launch_trainer_main --module=text.gpt.post_training \\
        --config=sft-tiny-strings --trainer_dir=/tmp/sft --jax_backend=cpu
    python -m axlearn.common.launch_trainer_main --module=text.gpt.post_training \\
        --config=dpo-tiny-strings --trainer_dir=/tmp/dpo --jax_backend=cpu
    python -m axlearn.common.launch_trainer_main --module=text.gpt.post_training \\
        --config=grpo-copy-digits --trainer_dir=/tmp/grpo --jax_backend=cpu

- `sft-tiny-strings`: a 2-layer, dim-64 decoder (character vocabulary) learns the instruction
  set (`reverse cafe` -> `efac`, ...) with the loss on response tokens only; packed rows of 128
  tokens. The `validation` evaler's loss is the held-out response loss (every 5th record).
- `dpo-tiny-strings`: the same model trained with DPO (`dpo.DpoModel`, beta 0.3) on the
  preference set (the right answer chosen; the input copied or another instruction's answer
  rejected, see `post_training_data`); the frozen reference is
  held in the trainer state without optimizer state. The `validation` evaler reports
  rewards/accuracy on held-out pairs.
- `grpo-copy-digits`: GRPO in `SpmdTrainer`: a 2-layer, dim-64 decoder (untied head) from random
  weights learns to copy a 3-digit string from the per-digit reward alone. Each step the
  `grpo.rollout.GrpoRollout` batch processor samples 8 completions of each of 8 prompts with the
  KV-cache decoder, scores them (`CopyDigitsReward`, a config) and computes the reference's
  log-probs; `grpo.model.GrpoModel` trains the clipped surrogate with a k3 KL to the frozen
  reference. Summaries `grpo/rollout_seconds`, `grpo/reference_seconds`,
  `grpo/training_seconds` split each step's time.

Each is also named `<name>-lora` (e.g. `sft-tiny-strings-lora`): the same run with rank-8 LoRA
adapters on the attention projections (`lora_config_modifier.LoraConfigModifier`), training only
the policy's adapters.

To start either from another run's checkpoint (e.g. DPO from the SFT run, or SFT from an
imported Hugging Face model, `axlearn hf import`), write a step-0 checkpoint into the new trainer
dir first: `axlearn.common.finetune.init_from_trainer_dir` (see docs/post_training.md).
"""

from __future__ import annotations

from typing import Callable

from axlearn.common import dpo, evaler, learner, optimizers, post_training_data, schedule, sft
from axlearn.common.checkpointer import every_n_steps_and_last_policy
from axlearn.common.config import config_for_function
from axlearn.common.grpo import copy_task, rewards
from axlearn.common.grpo.model import FROZEN_REFERENCE_RULES as GRPO_FROZEN_REFERENCE_RULES
from axlearn.common.grpo.model import GrpoModel
from axlearn.common.grpo.rollout import GrpoRollout, PromptInput
from axlearn.common.lora_config_modifier import LoraConfigModifier
from axlearn.common.summary_writer import CompositeWriter, JsonlWriter, SummaryWriter
from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.text.gpt.grpo_copy import copy_digits_policy_config
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config
from axlearn.experiments.text.gpt.tiny import BATCH_AXIS_NAMES, MESH_AXIS_NAMES, _mesh

# The chat template of the toy sets.
TEMPLATE = dict(prompt_format="Q: {prompt}\nA: ", response_format="{response}")
# The model's vocabulary: CharVocabulary's ids (2 + alphabet), rounded up.
VOCAB_SIZE = 128
# The adapters' rank of the `-lora` configs (alpha = 2 x rank).
LORA_RANK = 8


def _model(*, num_layers: int, model_dim: int):
    return transformer_lm_config(
        num_layers=num_layers,
        model_dim=model_dim,
        num_heads=model_dim // 16,
        hidden_dim=4 * model_dim,
        vocab_size=VOCAB_SIZE,
        stack="stack",
        pad_token_id=sft.PAD_ID,
        eos_token_id=sft.EOS_ID,
    )


def _learner(*, peak_lr: float, max_step: int, rules=()) -> learner.Learner.Config:
    lr = config_for_function(schedule.cosine_with_linear_warmup).set(
        peak_lr=peak_lr,
        max_step=max_step,
        warmup_steps=max(1, max_step // 20),
        begin_value=0.0,
        alpha=0.1,
    )
    return learner.Learner.default_config().set(
        optimizer=config_for_function(optimizers.skip_and_clip_by_global_norm).set(
            inner=config_for_function(optimizers.adamw_optimizer).set(
                learning_rate=lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=1e-4
            ),
            drop_norm=100.0,
            max_norm=1.0,
        ),
        update_rules=list(rules),
    )


def _trainer(*, name: str, max_step: int) -> SpmdTrainer.Config:
    cfg = SpmdTrainer.default_config().set(
        name=name,
        max_step=max_step,
        mesh_axis_names=MESH_AXIS_NAMES,
        mesh_shape=_mesh(data=-1),
        batch_axis_names=BATCH_AXIS_NAMES,
        mesh_rules=[("cpu-fsdp", _mesh(fsdp=-1))],
    )
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_and_last_policy).set(
        n=max_step, max_step=max_step
    )
    cfg.checkpointer.keep_last_n = 2
    # The input position is checkpointed: a resumed run reads the batches it would have read.
    cfg.save_input_iterator = True
    cfg.summary_writer.write_every_n_steps = 10
    cfg.log_every_n_steps = 10
    return cfg


def _evaler(input_cfg, *, every_n: int, max_step: int) -> evaler.SpmdEvaler.Config:
    eval_cfg = evaler.SpmdEvaler.default_config().set(input=input_cfg)
    # Also at step 0 (before training), so the run shows where the held-out metrics start.
    eval_cfg.eval_policy.set(n=every_n, min_step=0, max_step=max_step)
    # TensorBoard and <dir>/summaries/<evaler>/jsonl/metrics.jsonl.
    eval_cfg.summary_writer = CompositeWriter.default_config().set(
        writers=dict(tensorboard=SummaryWriter.default_config(), jsonl=JsonlWriter.default_config())
    )
    return eval_cfg


def sft_trainer_config(
    *,
    max_step: int = 200,
    global_batch_size: int = 8,
    max_len: int = 128,
    num_layers: int = 2,
    model_dim: int = 64,
    peak_lr: float = 3e-3,
    eval_every_n_steps: int = 50,
) -> SpmdTrainer.Config:
    """The SFT toy run: response-only loss on the shipped instruction set.

    Args:
        max_step: Training steps.
        global_batch_size: Packed rows per step.
        max_len: Tokens per row.
        num_layers: Transformer layers.
        model_dim: Model dim (heads of dim 16).
        peak_lr: Peak learning rate of the cosine schedule.
        eval_every_n_steps: Held-out evaluation interval (also at step 0 and the last step).

    Returns:
        The trainer config.
    """
    cfg = _trainer(name="sft_trainer", max_step=max_step)
    cfg.model = _model(num_layers=num_layers, model_dim=model_dim)

    def data(split: str, is_training: bool):
        return sft.SftInput.default_config().set(
            is_training=is_training,
            path=post_training_data.INSTRUCTIONS_PATH,
            split=split,
            global_batch_size=global_batch_size,
            max_len=max_len,
            template=sft.ChatTemplate.default_config().set(**TEMPLATE),
        )

    cfg.input = data("train", True)
    cfg.learner = _learner(peak_lr=peak_lr, max_step=max_step)
    cfg.evalers["validation"] = _evaler(
        data("validation", False), every_n=eval_every_n_steps, max_step=max_step
    )
    return cfg


def dpo_trainer_config(
    *,
    max_step: int = 150,
    global_batch_size: int = 16,
    max_len: int = 40,
    num_layers: int = 2,
    model_dim: int = 64,
    peak_lr: float = 3e-3,
    beta: float = 0.3,
    loss_type: str = "sigmoid",
    eval_every_n_steps: int = 50,
) -> SpmdTrainer.Config:
    """The DPO toy run: the policy learns to prefer the right answers on the preference set.

    Args:
        max_step: Training steps.
        global_batch_size: Preference pairs per step.
        max_len: Tokens per row (one response per row).
        num_layers: Transformer layers.
        model_dim: Model dim (heads of dim 16).
        peak_lr: Peak learning rate of the cosine schedule.
        beta: DPO's beta.
        loss_type: "sigmoid" (DPO) or "ipo".
        eval_every_n_steps: Held-out evaluation interval (also at step 0 and the last step).

    Returns:
        The trainer config.
    """
    cfg = _trainer(name="dpo_trainer", max_step=max_step)
    cfg.model = dpo.DpoModel.default_config().set(
        policy=_model(num_layers=num_layers, model_dim=model_dim), beta=beta, loss_type=loss_type
    )

    def data(split: str, is_training: bool):
        return dpo.PreferenceInput.default_config().set(
            is_training=is_training,
            path=post_training_data.PREFERENCES_PATH,
            split=split,
            global_batch_size=global_batch_size,
            max_len=max_len,
            template=sft.ChatTemplate.default_config().set(**TEMPLATE),
        )

    cfg.input = data("train", True)
    cfg.learner = _learner(peak_lr=peak_lr, max_step=max_step, rules=dpo.FROZEN_REFERENCE_RULES)
    cfg.evalers["validation"] = _evaler(
        data("validation", False), every_n=eval_every_n_steps, max_step=max_step
    )
    return cfg


def grpo_trainer_config(
    *,
    max_step: int = 200,
    num_prompts: int = 8,
    group_size: int = 8,
    num_digits: int = 3,
    num_symbols: int = 10,
    model_dim: int = 64,
    num_layers: int = 2,
    learning_rate: float = 3e-3,
    kl_coef: float = 0.01,
    checkpoint_every_n_steps: int = 100,
) -> SpmdTrainer.Config:
    """The GRPO toy run in SpmdTrainer: copy a digit string, from the reward alone.

    Args:
        max_step: Training steps.
        num_prompts: Prompts per step.
        group_size: Samples per prompt.
        num_digits: Digits to copy.
        num_symbols: Distinct digits.
        model_dim: Model dim (heads of dim 16).
        num_layers: Transformer layers.
        learning_rate: Adam's learning rate (constant).
        kl_coef: The KL weight.
        checkpoint_every_n_steps: Checkpoint interval (and the last step).

    Returns:
        The trainer config.
    """
    cfg = _trainer(name="grpo_trainer", max_step=max_step)
    cfg.checkpointer.save_policy.set(n=checkpoint_every_n_steps)
    policy = copy_digits_policy_config(
        num_layers=num_layers, model_dim=model_dim, num_symbols=num_symbols
    )
    cfg.model = GrpoModel.default_config().set(policy=policy, kl_coef=kl_coef)
    cfg.input = PromptInput.default_config().set(
        source=copy_task.CopyDigitsPrompts.default_config().set(
            num_prompts=num_prompts, num_digits=num_digits, num_symbols=num_symbols
        )
    )
    cfg.batch_processor = GrpoRollout.default_config().set(
        reward=rewards.CopyDigitsReward.default_config().set(mode="per_digit"),
        group_size=group_size,
        max_new_tokens=num_digits + 1,
    )
    cfg.learner = learner.Learner.default_config().set(
        optimizer=config_for_function(optimizers.adam_optimizer).set(
            learning_rate=learning_rate, b1=0.9, b2=0.99, eps=1e-8
        ),
        update_rules=list(GRPO_FROZEN_REFERENCE_RULES),
    )
    return cfg


def lora_config_fn(base: Callable[[], SpmdTrainer.Config]) -> Callable[[], SpmdTrainer.Config]:
    """`base` with rank-8 LoRA adapters on every attention projection of the (policy) model.

    Only the policy's adapters train; the frozen reference of DPO/GRPO (a clone of the policy,
    adapters included) stays frozen with no optimizer state (`lora_config_modifier`).

    Args:
        base: A config fn of this module.

    Returns:
        The LoRA run's config fn.
    """

    def config_fn() -> SpmdTrainer.Config:
        modifier = LoraConfigModifier.default_config().set(rank=LORA_RANK, alpha=2.0 * LORA_RANK)
        return modifier.instantiate()(base())

    return config_fn


def named_trainer_configs() -> dict:
    """The named trainer configs of this module (each also as `<name>-lora`)."""
    configs = {
        "sft-tiny-strings": sft_trainer_config,
        "dpo-tiny-strings": dpo_trainer_config,
        "grpo-copy-digits": grpo_trainer_config,
    }
    configs.update({f"{name}-lora": lora_config_fn(fn) for name, fn in list(configs.items())})
    return configs
