"""Optimizers: optax transformations with state partitioning, plus what optax lacks.

Every function returns a `PartitionedGradientTransformation` (see optimizer_base.py): optax's
`init`/`update` on trees of `OptParam`, plus `partition(param_specs) -> state specs`, so optimizer
state is created and sharded like the parameters. Where optax has the transformation, it is used
(`scale_by_adam`, `trace`, `scale_by_lion`, `scale_by_factored_rms`, ...); this module adds
per-parameter scales by path regex, weight decay that honours `ParameterSpec.weight_decay_scale`,
skipping abnormal steps, parameter EMA, and the `adastar` family.

Learning rates and other schedules accept a number, a `step -> value` function or a schedule
config (see schedule.py). Transformations add summaries (`learning_rate`, `gradient_norm`,
`nonvalid_count`, ...) to the current invocation context when there is one, i.e. when called from
a learner inside `functional`.

The implementation is split by topic (transforms, per_param, standard, clipping, adastar); every
public name is exported here and reports this module as its `__module__`, so configs dump as
`axlearn.common.optimizers.<name>`.
"""

import jax
from jax import numpy as jnp

from axlearn.common.optimizers.adastar import AdastarState, adastar_optimizer
from axlearn.common.optimizers.clipping import (
    DropNormThresholdFn,
    SkipClipState,
    clip_by_global_norm,
    drop_norm_by_grad_norm_ema,
    drop_norm_by_grad_norm_stddev,
    skip_and_clip_by_global_norm,
)
from axlearn.common.optimizers.per_param import (
    AddDecayedWeightsState,
    add_decayed_weights,
    l2_regularizer,
    opt_params_from_specs,
    per_param_scale_by_path,
    per_param_settings_of_optimizer,
    regularizer_text,
    scale_update_per_param,
)
from axlearn.common.optimizers.standard import (
    adafactor_optimizer,
    adam_optimizer,
    adamw_decoupled_optimizer,
    adamw_optimizer,
    lion_optimizer,
    scale_by_factored_rms,
    scale_by_lion,
    sgd_optimizer,
)
from axlearn.common.optimizers.transforms import (
    EmaState,
    ParamEmaState,
    adam_partition,
    chain,
    clip_by_block_rms,
    copy_partition,
    ema,
    global_norm,
    named_chain,
    offload_optimizer,
    opt_param_values,
    param_ema,
    per_param_scale_by_rms,
    replace_with_updates,
    scale,
    scale_by_param_block_rms,
    scale_by_schedule,
    scale_by_trust_ratio,
    scale_from_learning_rate,
    trace_partition,
    with_partition_fn,
)


def _compute_rms_norms(tree):
    """Per-leaf RMS over the last axis: sqrt(mean(x ** 2, axis=-1)) (None leaves stay None)."""
    return jax.tree.map(lambda x: jnp.sqrt(jnp.mean(jnp.square(x), axis=-1)), tree)


def _compute_covariance(x_tree, y_tree):
    """Per-leaf mean(x * y, axis=-1) of two trees of the same structure."""
    return jax.tree.map(lambda x, y: jnp.mean(x * y, axis=-1), x_tree, y_tree)


__all__ = [
    "AdastarState",
    "AddDecayedWeightsState",
    "DropNormThresholdFn",
    "EmaState",
    "ParamEmaState",
    "SkipClipState",
    "adafactor_optimizer",
    "adam_optimizer",
    "adam_partition",
    "adamw_decoupled_optimizer",
    "adamw_optimizer",
    "adastar_optimizer",
    "add_decayed_weights",
    "chain",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "copy_partition",
    "drop_norm_by_grad_norm_ema",
    "drop_norm_by_grad_norm_stddev",
    "ema",
    "global_norm",
    "l2_regularizer",
    "lion_optimizer",
    "named_chain",
    "offload_optimizer",
    "opt_param_values",
    "opt_params_from_specs",
    "param_ema",
    "per_param_scale_by_path",
    "per_param_scale_by_rms",
    "per_param_settings_of_optimizer",
    "regularizer_text",
    "replace_with_updates",
    "scale",
    "scale_by_factored_rms",
    "scale_by_lion",
    "scale_by_param_block_rms",
    "scale_by_schedule",
    "scale_by_trust_ratio",
    "scale_from_learning_rate",
    "scale_update_per_param",
    "sgd_optimizer",
    "skip_and_clip_by_global_norm",
    "trace_partition",
    "with_partition_fn",
]

# Public functions and classes report this package as their module (dumped config names).
for _name in __all__:
    _value = globals()[_name]
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        try:
            _value.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _value
