"""Vector quantizers: map each frame to the ids of its nearest codebook entries.

Every quantizer has a codebook parameter [codebook_size, num_codebooks, codebook_dim]: a frame of
`num_codebooks * codebook_dim` features is split into `num_codebooks` groups, and each group is
replaced by one entry of its own codebook. `forward(inputs, paddings=)` returns
`BaseQuantizer.Output(ids [..., num_codebooks], quantized_vectors [..., num_codebooks,
codebook_dim], loss)`; padded frames get id -1 and zero vectors. `lookup(ids)` maps ids back to
vectors. Each forward adds the summaries "codebook/num_frames", "codebook/coverage" (the mean
fraction of codebook entries used), "codebook/pplx" (the mean perplexity of the code
distribution over the non-padded frames) and "codebook/entropy" (its log).

- `RandomVectorQuantizer` (BEST-RQ, arXiv:2202.01855): a frozen random projection and a frozen
  random codebook; no gradient flows through it.
- `KmeansVectorQuantizer` (VQ-VAE, arXiv:1711.00937): nearest neighbour by L2 distance; the loss
  is the codebook ("k-means") loss plus `beta` times the commitment loss, and the inputs get the
  gradient of the outputs through the straight-through estimator.
- `GumbelSoftmaxVectorQuantizer` (vq-wav2vec, arXiv:1910.05453): ids are the argmax of projected
  logits; in training, Gumbel noise and a temperature schedule, with the straight-through
  Gumbel-softmax gradient.
"""

from __future__ import annotations

from enum import Enum, unique
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.layers import Linear, MultiLinear
from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import InvocationContext, Module, current_context
from axlearn.common.normalize import l2_normalize
from axlearn.common.param_init import (
    DefaultInitializer,
    FanAxes,
    GaussianInitializer,
    WeightInitializer,
    constant_initializer,
)
from axlearn.common.schedule import Schedule, as_schedule_fn
from axlearn.common.utils import Nested, NestedTensor, Tensor, safe_not

_NORM_EPS = 1e-12


def compute_code_histogram(onehots: Tensor, paddings: Tensor) -> Tensor:
    """Returns the counts of each code over the non-padded frames.

    Args:
        onehots: [..., num_codebooks, codebook_size] one-hot codes.
        paddings: [...], True (or 1) at padded frames.

    Returns:
        [num_codebooks, codebook_size] counts.
    """
    valid = safe_not(paddings).astype(onehots.dtype)[..., None, None]
    return jnp.sum(onehots * valid, axis=tuple(range(onehots.ndim - 2)))


def compute_code_pplx(onehots: Tensor, paddings: Tensor) -> tuple[Tensor, Tensor]:
    """Returns the perplexity of the code distribution (averaged over codebooks) and its log.

    Args:
        onehots: [..., num_codebooks, codebook_size] one-hot codes.
        paddings: [...], True at padded frames.

    Returns:
        (mean over codebooks of exp(entropy of the codebook's code frequencies), log of that).
    """
    counts = compute_code_histogram(onehots, paddings)
    num_frames = jnp.maximum(jnp.sum(safe_not(paddings)), 1.0)
    probs = counts / num_frames
    entropy = -jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)
    pplx = jnp.mean(jnp.exp(entropy))
    return pplx, jnp.log(pplx)


def compute_code_coverage(onehots: Tensor, paddings: Tensor) -> Tensor:
    """Returns the fraction of codebook entries used at least once, averaged over codebooks.

    Args:
        onehots: [..., num_codebooks, codebook_size] one-hot codes.
        paddings: [...], True at padded frames.

    Returns:
        A scalar in [0, 1].
    """
    used = compute_code_histogram(onehots, paddings) > 0
    return jnp.mean(jnp.mean(used.astype(jnp.float32), axis=-1))


class BaseQuantizer(BaseLayer):
    """The interface of vector quantizers (see the module docstring)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseQuantizer."""

        # The dimension of each codebook entry.
        codebook_dim: Required[int] = REQUIRED
        # The number of entries of each codebook.
        codebook_size: Required[int] = REQUIRED
        # The number of codebooks (groups of the input features).
        num_codebooks: Required[int] = REQUIRED

    class Output(NamedTuple):
        """The quantizer's outputs."""

        # [..., num_codebooks] int32 ids (-1 at padded frames).
        ids: Tensor
        # [..., num_codebooks, codebook_dim] (zeros at padded frames).
        quantized_vectors: Tensor
        # The scalar quantizer loss, if the quantizer has one.
        loss: Optional[Tensor] = None

    @classmethod
    def default_config(cls) -> Config:
        """Returns the config; `param_init` must be set (subclasses set it)."""
        cfg = super().default_config()
        cfg.param_partition_spec = (None, None, None)  # The codebook is not sharded.
        cfg.param_init = REQUIRED
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        return dict(
            codebook=ParameterSpec(
                shape=(cfg.codebook_size, cfg.num_codebooks, cfg.codebook_dim),
                mesh_axes=cfg.param_partition_spec,
            )
        )

    def forward(self, inputs: Tensor, *, paddings: Tensor) -> Output:
        """Quantizes `inputs` [batch, seq_len, input_dim]; `paddings` [batch, seq_len].

        Returns:
            BaseQuantizer.Output.
        """
        raise NotImplementedError(type(self))

    def lookup(self, ids: Tensor) -> Output:
        """Returns the codebook vectors of `ids` [..., num_codebooks] (values in [0, size)).

        Args:
            ids: The ids.

        Returns:
            BaseQuantizer.Output with quantized_vectors [..., num_codebooks, codebook_dim].
        """
        return _lookup(ids=ids, codebook=self.parameters["codebook"])


def _lookup(*, ids: Tensor, codebook: Tensor) -> BaseQuantizer.Output:
    """Gathers `codebook[ids[..., g], g]` for each codebook g."""
    groups = jnp.arange(ids.shape[-1])
    return BaseQuantizer.Output(ids=ids, quantized_vectors=codebook[ids, groups])


@unique
class SimilarityMetric(Enum):
    """How `quantize_by_nearest_neighbor` ranks codebook entries."""

    L2_DISTANCE = 0
    DOT_PRODUCT = 1


def quantize_by_nearest_neighbor(
    inputs: Tensor, *, codebook: Tensor, metric: SimilarityMetric
) -> BaseQuantizer.Output:
    """Picks, per codebook, the entry closest to each input vector.

    Args:
        inputs: [..., num_codebooks, codebook_dim].
        codebook: [codebook_size, num_codebooks, codebook_dim].
        metric: L2_DISTANCE (smallest squared distance) or DOT_PRODUCT (largest dot product).

    Returns:
        BaseQuantizer.Output (no loss).

    Raises:
        ValueError: If the last two dims of inputs and codebook differ, or metric is unknown.
    """
    if tuple(codebook.shape[-2:]) != tuple(inputs.shape[-2:]):
        raise ValueError(
            "Last two dimensions of inputs should match with [num_codebooks, codebook_dim]: "
            f"{tuple(inputs.shape[-2:])} != {tuple(codebook.shape[-2:])}."
        )
    # [..., codebook_size, num_codebooks]: the terms of |x - c|^2 that depend on c.
    scores = -2.0 * jnp.einsum("...gd,vgd->...vg", inputs, codebook)
    if metric == SimilarityMetric.L2_DISTANCE:
        scores = scores + jnp.sum(jnp.square(codebook), axis=-1)
    elif metric != SimilarityMetric.DOT_PRODUCT:
        raise ValueError(f"Expect DOT_PRODUCT metric or L2_DISTANCE metric, but got {metric}.")
    ids = jnp.argmin(scores, axis=-2).astype(jnp.int32)
    return _lookup(ids=ids, codebook=codebook)


def _apply_paddings(*, outputs: BaseQuantizer.Output, paddings: Tensor) -> BaseQuantizer.Output:
    """Sets ids to -1 and vectors to 0 at padded frames ([batch, seq_len] paddings)."""
    padded = jnp.asarray(paddings).astype(jnp.bool_)
    ids = jnp.where(padded[:, :, None], jnp.asarray(-1, outputs.ids.dtype), outputs.ids)
    vectors = outputs.quantized_vectors * safe_not(padded)[:, :, None, None]
    return BaseQuantizer.Output(ids=ids, quantized_vectors=vectors, loss=outputs.loss)


def _ids_to_onehots(ids: Tensor, *, codebook_size: int, dtype: jnp.dtype) -> Tensor:
    """[..., num_codebooks] ids -> [..., num_codebooks, codebook_size] (id -1: all zeros)."""
    return jax.nn.one_hot(ids, num_classes=codebook_size, dtype=dtype)


def _add_codebook_summaries(*, context: InvocationContext, onehots: Tensor, paddings: Tensor):
    """Adds the codebook usage summaries of the non-padded frames to `context`."""
    batch_size = paddings.shape[0]
    num_frames = jnp.sum(safe_not(paddings))
    weight = jnp.maximum(1, num_frames)
    pplx, entropy = compute_code_pplx(onehots=onehots, paddings=paddings)
    context.add_summary(
        "codebook/num_frames",
        WeightedSummary(num_frames.astype(jnp.float32) / batch_size, batch_size),
    )
    context.add_summary(
        "codebook/coverage",
        WeightedSummary(compute_code_coverage(onehots=onehots, paddings=paddings), weight),
    )
    context.add_summary("codebook/pplx", WeightedSummary(pplx, weight))
    context.add_summary("codebook/entropy", WeightedSummary(entropy, weight))


def _check_input_dim(layer: BaseLayer, inputs: Tensor, expected: int, field: str) -> None:
    if inputs.shape[-1] != expected:
        raise ValueError(
            f"{layer.path()}: inputs have {inputs.shape[-1]} features, but {field} needs "
            f"{expected}."
        )


class RandomVectorQuantizer(BaseQuantizer):
    """BEST-RQ's random-projection quantizer: frozen projection and codebook, no gradients."""

    @config_class
    class Config(BaseQuantizer.Config):
        """Configures RandomVectorQuantizer."""

        # The input feature dim.
        input_dim: Required[int] = REQUIRED
        # The random projection to num_codebooks * codebook_dim features (Xavier init).
        rand_proj: Linear.Config = Linear.default_config().set(bias=False)
        # Whether the codebook is L2-normalized (once, at initialization).
        normalize_codebook: bool = True
        # Whether the projected inputs are L2-normalized per codebook group.
        normalize_inputs: bool = True

    @classmethod
    def default_config(cls) -> Config:
        """Returns the config, with a standard normal codebook (section 3.1 of BEST-RQ)."""
        cfg = super().default_config()
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={".*codebook$": GaussianInitializer.default_config().set(std=1.0)}
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "rand_proj",
            cfg.rand_proj.set(
                input_dim=cfg.input_dim, output_dim=cfg.num_codebooks * cfg.codebook_dim
            ),
        )

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[Nested[Optional[ParameterSpec]]] = None
    ) -> NestedTensor:
        """Initializes the parameters; the codebook is normalized here (it is frozen)."""
        params = super().initialize_parameters_recursively(prng_key, prebuilt=prebuilt)
        if self.config.normalize_codebook and "codebook" in params:
            params["codebook"] = l2_normalize(params["codebook"], eps=_NORM_EPS, axis=-1)
        return params

    def forward(self, inputs: Tensor, *, paddings: Tensor) -> BaseQuantizer.Output:
        """Projects and quantizes `inputs` [batch, seq_len, input_dim].

        Args:
            inputs: The frames.
            paddings: [batch, seq_len], True at padded frames.

        Returns:
            BaseQuantizer.Output without loss; gradients are stopped.

        Raises:
            ValueError: If the inputs' feature dim is not input_dim.
        """
        cfg = self.config
        _check_input_dim(self, inputs, cfg.input_dim, "input_dim")
        projected = self.rand_proj(inputs)
        groups = projected.reshape(projected.shape[:-1] + (cfg.num_codebooks, cfg.codebook_dim))
        if cfg.normalize_inputs:
            groups = l2_normalize(groups, eps=_NORM_EPS, axis=-1)
        # With a normalized codebook the nearest entry by L2 is the one of largest dot product.
        metric = (
            SimilarityMetric.DOT_PRODUCT if cfg.normalize_codebook else SimilarityMetric.L2_DISTANCE
        )
        outputs = quantize_by_nearest_neighbor(
            groups, codebook=self.parameters["codebook"], metric=metric
        )
        outputs = _apply_paddings(outputs=outputs, paddings=paddings)
        outputs = self.Output(
            ids=jax.lax.stop_gradient(outputs.ids),
            quantized_vectors=jax.lax.stop_gradient(outputs.quantized_vectors),
        )
        onehots = _ids_to_onehots(outputs.ids, codebook_size=cfg.codebook_size, dtype=jnp.int32)
        _add_codebook_summaries(context=current_context(), onehots=onehots, paddings=paddings)
        return outputs


class KmeansVectorQuantizer(BaseQuantizer):
    """VQ-VAE's quantizer: L2 nearest neighbour, k-means + commitment losses, straight-through.

    `normalize_inputs`/`normalize_codebook` L2-normalize the input groups / the codebook entries
    before the nearest-neighbour search and the losses (a normalized codebook is ranked by dot
    product, which then gives the same ids as L2).
    """

    @config_class
    class Config(BaseQuantizer.Config):
        """Configures KmeansVectorQuantizer."""

        # The weight of the commitment loss in the total loss.
        beta: Required[float] = REQUIRED
        # Whether the codebook entries are L2-normalized before use.
        normalize_codebook: bool = False
        # Whether the input groups are L2-normalized before use.
        normalize_inputs: bool = False

    @classmethod
    def default_config(cls) -> Config:
        """Returns the config: the codebook is U(+-sqrt(3 / fan_out)) as in VQ-VAE."""
        cfg = super().default_config()
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                ".*codebook$": WeightInitializer.default_config().set(
                    scale=1.0, fan="fan_out", distribution="uniform"
                )
            }
        )
        return cfg

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name == "codebook":
            # [codebook_size, num_codebooks, codebook_dim]: fan_out = num_codebooks * dim.
            return FanAxes(in_axis=0, out_axis=(1, 2))
        return super()._compute_fan_axes(name, parameter_spec)

    def forward(self, inputs: Tensor, *, paddings: Tensor) -> BaseQuantizer.Output:
        """Quantizes `inputs` [batch, seq_len, num_codebooks * codebook_dim].

        The codebook gets gradients from the k-means loss only; the inputs from the commitment
        loss and (straight-through) from whatever uses the quantized vectors. Adds module outputs
        "kmeans_loss" and "commitment_loss".

        Args:
            inputs: The frames.
            paddings: [batch, seq_len], True at padded frames.

        Returns:
            BaseQuantizer.Output with loss = kmeans_loss + beta * commitment_loss.

        Raises:
            ValueError: If the feature dim is not num_codebooks * codebook_dim.
        """
        cfg = self.config
        dim = cfg.num_codebooks * cfg.codebook_dim
        _check_input_dim(self, inputs, dim, "num_codebooks * codebook_dim")
        batch, seq_len = inputs.shape[:2]
        groups = inputs.reshape(batch, seq_len, cfg.num_codebooks, cfg.codebook_dim)
        codebook = self.parameters["codebook"]
        if cfg.normalize_inputs:
            groups = l2_normalize(groups, eps=_NORM_EPS, axis=-1)
        if cfg.normalize_codebook:
            codebook = l2_normalize(codebook, eps=_NORM_EPS, axis=-1)
        metric = (
            SimilarityMetric.DOT_PRODUCT if cfg.normalize_codebook else SimilarityMetric.L2_DISTANCE
        )
        nearest = quantize_by_nearest_neighbor(groups, codebook=codebook, metric=metric)
        nearest = _apply_paddings(outputs=nearest, paddings=paddings)
        q_vecs = nearest.quantized_vectors.reshape(batch, seq_len, dim)
        targets = groups.reshape(batch, seq_len, dim)

        valid = safe_not(paddings)[:, :, None]
        denominator = jnp.maximum(jnp.sum(safe_not(paddings)) * dim, 1)

        def masked_mse(a, b):
            return jnp.sum(jnp.square(a - b) * valid) / denominator

        # Eq. 3 of VQ-VAE: the codebook follows the inputs; the inputs commit to the codebook.
        kmeans_loss = masked_mse(q_vecs, jax.lax.stop_gradient(targets))
        commitment_loss = masked_mse(targets, jax.lax.stop_gradient(q_vecs))
        self.add_module_output("kmeans_loss", kmeans_loss)
        self.add_module_output("commitment_loss", commitment_loss)

        # Straight-through: the value of q_vecs, the gradient of the inputs (none when padded).
        straight = (inputs + jax.lax.stop_gradient(q_vecs - inputs)) * valid
        outputs = self.Output(
            ids=nearest.ids,
            quantized_vectors=straight.reshape(batch, seq_len, cfg.num_codebooks, -1),
            loss=kmeans_loss + cfg.beta * commitment_loss,
        )
        onehots = _ids_to_onehots(outputs.ids, codebook_size=cfg.codebook_size, dtype=jnp.int32)
        _add_codebook_summaries(context=current_context(), onehots=onehots, paddings=paddings)
        return outputs


class GumbelSoftmaxVectorQuantizer(BaseQuantizer):
    """vq-wav2vec's Gumbel-softmax quantizer: ids are the argmax of projected logits."""

    @config_class
    class Config(BaseQuantizer.Config):
        """Configures GumbelSoftmaxVectorQuantizer."""

        # The input feature dim.
        input_dim: Required[int] = REQUIRED
        # The projection to [num_codebooks, codebook_size] logits.
        input_proj: MultiLinear.Config = MultiLinear.default_config()
        # The Gumbel-softmax temperature as a schedule of the layer's `step` parameter.
        temperature_schedule: Required[Schedule] = REQUIRED

    @classmethod
    def default_config(cls) -> Config:
        """Returns the config: the codebook is U(-1, 1)."""
        cfg = super().default_config()
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                ".*codebook$": WeightInitializer.default_config().set(
                    scale=1.0, fan=None, distribution="uniform"
                )
            }
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "input_proj",
            cfg.input_proj.set(
                input_dim=cfg.input_dim,
                num_outputs=cfg.num_codebooks,
                output_dim=cfg.codebook_size,
            ),
        )
        self.temperature_schedule = as_schedule_fn(cfg.temperature_schedule)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        params = super()._create_layer_parameter_specs()
        # The number of training steps taken (drives the temperature schedule).
        params["step"] = ParameterSpec(
            shape=(),
            dtype=jnp.float32,
            mesh_axes=(),
            initializer=constant_initializer(0.0),
            weight_decay_scale=0.0,
        )
        return params

    def forward(self, inputs: Tensor, *, paddings: Tensor) -> BaseQuantizer.Output:
        """Quantizes `inputs` [batch, seq_len, input_dim].

        In training, logits get Gumbel noise and are divided by the temperature; the vectors
        are the one-hot codes times the codebook with the gradient of the softmax codes
        (straight-through). Training adds the module output "probs" (the softmax) and the
        summaries "codebook/temperature" and "codebook/temperature_schedule_step", and
        increments `step`.

        Args:
            inputs: The frames.
            paddings: [batch, seq_len], True at padded frames.

        Returns:
            BaseQuantizer.Output without loss.

        Raises:
            ValueError: If the inputs' feature dim is not input_dim.
        """
        cfg = self.config
        _check_input_dim(self, inputs, cfg.input_dim, "input_dim")
        logits = self.input_proj(inputs)  # [batch, seq_len, num_codebooks, codebook_size].
        if not self.is_training:
            outputs = _apply_paddings(
                outputs=self.lookup(jnp.argmax(logits, axis=-1).astype(jnp.int32)),
                paddings=paddings,
            )
        else:
            step = self.parameters["step"]
            tau = self.temperature_schedule(step)
            noise = jax.random.gumbel(self.prng_key, logits.shape, logits.dtype)
            logits = (logits + noise) / tau
            self.add_state_update("step", step + 1)
            valid = safe_not(paddings)[:, :, None]  # [batch, seq_len, 1].
            ids = jnp.where(valid, jnp.argmax(logits, axis=-1), -1).astype(jnp.int32)
            hard = _ids_to_onehots(ids, codebook_size=cfg.codebook_size, dtype=inputs.dtype)
            soft = jax.nn.softmax(logits, axis=-1) * valid[..., None]
            codes = soft + jax.lax.stop_gradient(hard - soft)
            vectors = jnp.einsum("...gv,vgd->...gd", codes, self.parameters["codebook"])
            outputs = self.Output(ids=ids, quantized_vectors=vectors * valid[..., None])
        onehots = _ids_to_onehots(outputs.ids, codebook_size=cfg.codebook_size, dtype=jnp.int32)
        _add_codebook_summaries(context=current_context(), onehots=onehots, paddings=paddings)
        if self.is_training:
            self.add_module_output("probs", soft)
            self.add_summary("codebook/temperature_schedule_step", step)
            self.add_summary("codebook/temperature", tau)
        return outputs
