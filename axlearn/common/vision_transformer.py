"""Vision Transformer (ViT): patch embedding, a class-token encoder and pooled image features.

`build_vit_model_config(num_layers=..., model_dim=..., num_heads=...)` builds a
`VisionTransformer` config; `named_model_configs()` gives the named sizes (Ti16, S16, B16, B32,
L14, L16, L32, H14, g14-paper, g14-clip, G14 and repeated variants of the large ones).

Shapes: an image `[batch, height, width, channels]` becomes patches `[batch, num_patches, dim]`
(`ConvertToSequence`), class tokens are prepended (`VisionTransformer.cls_token`), a learned
positional embedding is added and a pre-norm transformer with GELU feed-forward layers encodes
the sequence (`Encoder1D`); the pooler (first tokens or the average) gives the embedding.
"""

import copy
import math
from typing import Any, Optional

import jax
import numpy as np
from jax import numpy as jnp

from axlearn.common import param_init
from axlearn.common.attention import (
    BaseStackedTransformerLayer,
    LearnedPositionalEmbedding,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    build_remat_spec,
    scaled_hidden_dim,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.convolution import Conv2D
from axlearn.common.layers import (
    Dropout,
    DropToken,
    L2Norm,
    LayerNorm,
    Linear,
    set_dropout_rate_recursively,
)
from axlearn.common.module import Module, Tensor
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, GaussianInitializer
from axlearn.common.poolings import AveragePooling, BasePoolingLayer, FirstNTokenPooling


def layer_norm_config(eps: float = 1e-6) -> LayerNorm.Config:
    """Returns a LayerNorm config with ViT's epsilon.

    Args:
        eps: The epsilon.

    Returns:
        The config.
    """
    return LayerNorm.default_config().set(eps=eps)


def sequence_to_space_with_scaling(
    x: Tensor, *, num_cls_tokens: int, target_len: Optional[int] = None
) -> dict[str, Tensor]:
    """Reshapes patch tokens into a square grid, optionally resized (bicubic) to `target_len`.

    Args:
        x: [batch, num_cls_tokens + length, dim], `length` a square number.
        num_cls_tokens: Leading tokens that are not patches (kept as they are).
        target_len: None, or the square number of patches to resize the grid to.

    Returns:
        {"sequence_features": [batch, num_cls_tokens + new_length, dim],
         "space_features": [batch, side, side, dim]}.

    Raises:
        ValueError: If the patch count or `target_len` is not a square number.
    """
    cls_tokens, patches = x[:, :num_cls_tokens, :], x[:, num_cls_tokens:, :]
    batch, length, dim = patches.shape
    side = math.isqrt(length)
    if side * side != length:
        raise ValueError(f"seq_len has to be a square number, but got {length}.")
    space = jnp.reshape(patches, (batch, side, side, dim))
    if target_len:
        new_side = math.isqrt(target_len)
        if new_side * new_side != target_len:
            raise ValueError(f"target_len has to be a square number, but got {target_len}.")
        space = jax.image.resize(space, (batch, new_side, new_side, dim), method="bicubic")
    sequence = jnp.concatenate([cls_tokens, jnp.reshape(space, (batch, -1, dim))], axis=1)
    return {"sequence_features": sequence, "space_features": space}


class ConvertToSequence(BaseLayer):
    """Patch embedding: a strided convolution whose output grid is flattened to a sequence."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures ConvertToSequence."""

        # The patch (convolution window) size.
        patch_size: tuple[int, int] = (16, 16)
        # Channels of the input image or feature map.
        input_dim: Required[int] = REQUIRED
        # The token dim.
        output_dim: Required[int] = REQUIRED
        # The convolution (window, strides, padding and dims are set from the fields above).
        conv: InstantiableConfig = Conv2D.default_config().set(
            bias=True, param_partition_spec=(None, None, None, "model")
        )
        # The patch stride (None: patch_size, non-overlapping patches).
        stride: Optional[tuple[int, int]] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "conv",
            cfg.conv.clone(
                window=cfg.patch_size,
                strides=cfg.stride or cfg.patch_size,
                padding=((0, 0), (0, 0)),
                input_dim=cfg.input_dim,
                output_dim=cfg.output_dim,
            ),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Embeds patches.

        Args:
            x: [batch, height, width, input_dim].

        Returns:
            [batch, grid_height * grid_width, output_dim], in row-major grid order.
        """
        x = self.conv(x)
        batch, height, width, dim = x.shape
        return jnp.reshape(x, (batch, height * width, dim))


class Encoder1D(BaseLayer):
    """Positional embedding, dropout and a transformer stack over a token sequence."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Encoder1D."""

        # Token dim.
        input_dim: Required[int] = REQUIRED
        # Leading class tokens (kept by drop_token and not rescaled with the pos_emb grid).
        num_cls_tokens: int = 1
        # An optional norm applied before the transformer (CLIP's pre-norm).
        input_norm: Optional[InstantiableConfig] = None
        # Dropout after the positional embedding.
        input_dropout: InstantiableConfig = Dropout.default_config().set(rate=0.1)
        # The learned positional embedding (its `shape` is the sequence length).
        pos_emb: InstantiableConfig = LearnedPositionalEmbedding.default_config()
        # The transformer stack.
        transformer: BaseStackedTransformerLayer.Config = StackedTransformerLayer.default_config()
        # The norm of the stack's output.
        output_norm: InstantiableConfig = layer_norm_config()
        # FLIP's token dropping in training (rate 0: off).
        drop_token: DropToken.Config = DropToken.default_config()
        # Whether to add the positional embedding.
        use_pos_emb: bool = True

    @classmethod
    def default_config(cls) -> Config:
        """ViT's defaults: pos_emb std 0.02, dropout 0.1, GELU 4x feed-forward, LayerNorm 1e-6."""
        cfg = super().default_config()
        cfg.pos_emb.param_init = GaussianInitializer.default_config().set(std=0.02)
        set_dropout_rate_recursively(cfg, dropout_rate=0.1)
        layer = cfg.transformer.layer
        layer.feed_forward.activation = "nn.gelu"
        layer.feed_forward.norm = layer_norm_config()
        layer.feed_forward.hidden_dim = scaled_hidden_dim(4)
        layer.self_attention.norm = layer_norm_config()
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("input_dropout", cfg.input_dropout)
        if cfg.input_norm is not None:
            self._add_child("input_norm", cfg.input_norm.clone(input_dim=cfg.input_dim))
        if cfg.use_pos_emb:
            self._add_child("pos_emb", cfg.pos_emb.clone(dim=cfg.input_dim))
        self._add_child("transformer", cfg.transformer.clone(input_dim=cfg.input_dim))
        self._add_child("output_norm", cfg.output_norm.clone(input_dim=cfg.input_dim))
        self._add_child("drop_token", cfg.drop_token.clone(num_cls_tokens=cfg.num_cls_tokens))

    def forward(self, inputs: Tensor) -> Tensor:
        """Encodes tokens.

        Args:
            inputs: [batch, length, input_dim]. A length other than the positional embedding's
                rescales its patch grid (bicubic) to the input's.

        Returns:
            [batch, length', input_dim] (length' < length only when drop_token drops tokens).
        """
        cfg = self.config
        x = inputs
        if cfg.use_pos_emb:
            pos_emb = self.pos_emb.embeddings()
            if pos_emb.shape[-2] != x.shape[-2]:
                pos_emb = sequence_to_space_with_scaling(
                    pos_emb[None],
                    num_cls_tokens=cfg.num_cls_tokens,
                    target_len=x.shape[-2] - cfg.num_cls_tokens,
                )["sequence_features"]
            x = x + pos_emb
        x = self.drop_token(x)
        x = self.input_dropout(x)
        if cfg.input_norm is not None:
            x = self.input_norm(x)
        x = self.transformer(x).data
        return self.output_norm(x)


class VisualEmbedding(BaseLayer):
    """An optional 2-D encoder followed by the patch embedding."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures VisualEmbedding."""

        # Token dim.
        output_dim: Required[int] = REQUIRED
        # An optional 2-D encoder (a module with `output_dim`) run before patching.
        encoder_2d: Optional[InstantiableConfig] = None
        # The patch embedding.
        convert_to_sequence: InstantiableConfig = ConvertToSequence.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        feature_dim = 3
        if cfg.encoder_2d is not None:
            feature_dim = self._add_child("encoder_2d", cfg.encoder_2d).output_dim
        self._add_child(
            "convert_to_sequence",
            cfg.convert_to_sequence.clone(input_dim=feature_dim, output_dim=cfg.output_dim),
        )

    def forward(self, image: Tensor) -> Tensor:
        """Embeds an image.

        Args:
            image: [batch, height, width, channels].

        Returns:
            [batch, num_patches, output_dim].
        """
        x = image
        if "encoder_2d" in self.children:
            x = self.encoder_2d(x)
        return self.convert_to_sequence(x)


class VisionTransformer(BaseLayer):
    """The ViT image encoder."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures VisionTransformer."""

        # Token dim (the encoder's and pooler's dims).
        output_dim: Required[int] = REQUIRED
        # Class tokens prepended to the patches (0 for average pooling).
        num_cls_tokens: Required[int] = REQUIRED
        # The patch embedding.
        visual_embed: VisualEmbedding.Config = VisualEmbedding.default_config()
        # The sequence encoder.
        encoder_1d: Encoder1D.Config = Encoder1D.default_config()
        # The pooler giving the global features.
        pooler: BasePoolingLayer.Config = FirstNTokenPooling.default_config()
        # Whether a learned mask token replaces the patches `is_masked` marks.
        use_mask_tokens: bool = False
        # An optional projection of the embedding.
        output_proj: Optional[InstantiableConfig] = None
        # An optional norm after output_proj.
        output_proj_norm: Optional[InstantiableConfig] = None

    @classmethod
    def default_config(cls) -> Config:
        """Weights initialize Xavier-uniform (fan_avg), as the original ViT."""
        cfg = super().default_config()
        cfg.param_init = param_init.DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: param_init.WeightInitializer.default_config().set(
                    fan="fan_avg", distribution="uniform"
                )
            }
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("visual_embed", cfg.visual_embed.clone(output_dim=cfg.output_dim))
        self._add_child(
            "encoder_1d",
            cfg.encoder_1d.clone(input_dim=cfg.output_dim, num_cls_tokens=cfg.num_cls_tokens),
        )
        self._add_child(
            "pooler", cfg.pooler.clone(input_dim=cfg.output_dim, output_dim=cfg.output_dim)
        )
        if cfg.output_proj is not None:
            self._add_child("output_proj", cfg.output_proj.clone(input_dim=cfg.output_dim))
        if cfg.output_proj_norm is not None:
            self._add_child("output_proj_norm", cfg.output_proj_norm)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        specs = {}
        if cfg.num_cls_tokens:
            specs["cls_token"] = ParameterSpec(
                shape=(1, cfg.num_cls_tokens, cfg.output_dim),
                mesh_axes=(None, None, "model"),
                initializer=param_init.constant_initializer(0.0),
            )
        if cfg.use_mask_tokens:
            specs["mask_token"] = ParameterSpec(
                shape=(1, 1, cfg.output_dim),
                mesh_axes=(None, None, "model"),
                initializer=param_init.gaussian_initializer(std=0.02),
            )
        return specs

    def get_output_features_dim(self) -> int:
        """Returns the embedding's dim (output_proj's when set)."""
        cfg = self.config
        return cfg.output_proj.output_dim if cfg.output_proj is not None else cfg.output_dim

    @property
    def endpoints_dims(self) -> dict[str, int]:
        """{level: dim} of the 2-D features (level log2(patch size)) and "embedding"."""
        cfg = self.config
        level = int(math.log2(cfg.visual_embed.convert_to_sequence.patch_size[0]))
        return {str(level): cfg.output_dim, "embedding": self.get_output_features_dim()}

    def forward(self, image: Tensor, is_masked: Optional[Tensor] = None) -> dict[str, Tensor]:
        """Encodes an image.

        Args:
            image: [batch, height, width, channels].
            is_masked: Optional [batch, num_patches] of 0/1: patches replaced by the mask token
                (only with use_mask_tokens).

        Returns:
            "encoded_features" [batch, length, dim]; "pooled_features" [batch, 1, dim];
            "patch_features" [batch, length - num_cls_tokens, dim]; "embedding" [batch, dim']
            (output_proj's dim when set); "distillation_features" [batch, n - 1, dim] with more
            than one class token; and, unless drop_token is on, str(level) [batch, h, w, dim],
            the patch features as a grid.
        """
        cfg = self.config
        batch = image.shape[0]
        x = self.visual_embed(image)
        if cfg.use_mask_tokens and is_masked is not None:
            masked = jnp.expand_dims(is_masked, -1).astype(x.dtype)
            x = x * (1 - masked) + self.parameters["mask_token"].astype(x.dtype) * masked
        if cfg.num_cls_tokens > 0:
            cls = jnp.broadcast_to(
                self.parameters["cls_token"].astype(x.dtype),
                (batch, cfg.num_cls_tokens, x.shape[-1]),
            )
            x = jnp.concatenate([cls, x], axis=1)
        x = self.encoder_1d(x)
        pooled = self.pooler(x)
        outputs = {
            "encoded_features": x,
            "pooled_features": pooled[:, :1],
            "patch_features": x[:, cfg.num_cls_tokens :],
        }
        if cfg.num_cls_tokens > 1:
            outputs["distillation_features"] = pooled[:, 1:]
        embedding = pooled[:, 0]
        if "output_proj" in self.children:
            embedding = self.output_proj(embedding)
            if "output_proj_norm" in self.children:
                embedding = self.output_proj_norm(embedding)
        outputs["embedding"] = embedding
        if cfg.encoder_1d.drop_token.rate == 0:
            level = int(math.log2(cfg.visual_embed.convert_to_sequence.patch_size[0]))
            outputs[str(level)] = sequence_to_space_with_scaling(
                x, num_cls_tokens=cfg.num_cls_tokens
            )["space_features"]
        return outputs


# Named sizes: the ViT paper's Table 1 and the scaling paper's Table 2 (arXiv 2010.11929,
# 2106.04560). The 14-pixel-patch large models pool by average ("gap": 256 tokens, not 257).
_NAMED_VIT_MODELS = {
    "Test16": dict(num_layers=1, model_dim=8, num_heads=4),
    "Ti16": dict(num_layers=12, model_dim=192, num_heads=3),
    "S16": dict(num_layers=12, model_dim=384, num_heads=6),
    "B16": dict(num_layers=12, model_dim=768, num_heads=12),
    "B32": dict(num_layers=12, model_dim=768, num_heads=12, patch_size=(32, 32)),
    "L14": dict(num_layers=24, model_dim=1024, num_heads=16, patch_size=(14, 14)),
    "L16": dict(num_layers=24, model_dim=1024, num_heads=16),
    "L32": dict(num_layers=24, model_dim=1024, num_heads=16, patch_size=(32, 32)),
    "H14": dict(
        num_layers=32,
        model_dim=1280,
        num_heads=16,
        patch_size=(14, 14),
        global_feature_extraction="gap",
    ),
    "g14-paper": dict(
        num_layers=40,
        model_dim=1408,
        num_heads=16,
        feed_forward_dim=6144,
        patch_size=(14, 14),
        global_feature_extraction="gap",
    ),
    "g14-clip": dict(num_layers=40, model_dim=1536, num_heads=16, patch_size=(14, 14)),
    "G14": dict(
        num_layers=48,
        model_dim=1664,
        num_heads=16,
        feed_forward_dim=8192,
        patch_size=(14, 14),
        global_feature_extraction="gap",
        dropout_rate=0.0,
    ),
}

_GLOBAL_FEATURE_EXTRACTIONS = ("cls_token", "cls_distill_token", "gap")


def _set_model_config(
    cfg: VisionTransformer.Config,
    *,
    num_layers: int,
    model_dim: int,
    num_heads: int,
    feed_forward_dim: Optional[int] = None,
    image_size: tuple[int, int] = (224, 224),
    patch_size: tuple[int, int] = (16, 16),
    stride: Optional[tuple[int, int]] = None,
    global_feature_extraction: str = "cls_token",
    dtype: jnp.dtype = jnp.float32,
    dropout_rate: float = 0.1,
    transformer_stack_cfg: Optional[InstantiableConfig] = None,
    remat: bool = False,
    peak_stochastic_depth_rate: Optional[float] = None,
    output_proj_dim: Optional[int] = None,
    use_pos_emb: bool = True,
    atten_logit_cap: Optional[float] = None,
):
    """Sets a VisionTransformer config in place (see `build_vit_model_config` for the args)."""
    stride = stride or patch_size
    if any((i - p) % s for i, p, s in zip(image_size, patch_size, stride)):
        raise ValueError(
            f"stride ({stride}) must divide image_size-patch_size ({image_size}-{patch_size})"
        )
    if global_feature_extraction not in _GLOBAL_FEATURE_EXTRACTIONS:
        raise ValueError(
            f"The global_feature_extraction ({global_feature_extraction}) is not supported: "
            f"use one of {_GLOBAL_FEATURE_EXTRACTIONS}."
        )
    cfg.dtype = dtype
    cfg.output_dim = model_dim
    embed = cfg.visual_embed.convert_to_sequence
    embed.patch_size, embed.stride = patch_size, stride
    encoder = cfg.encoder_1d
    if transformer_stack_cfg is not None:
        if remat:
            transformer_stack_cfg.layer.remat_spec = build_remat_spec(transformer_stack_cfg)
        encoder.transformer = transformer_stack_cfg
    encoder.transformer.num_layers = num_layers
    seq_len = int(np.prod([(i - p) // s + 1 for i, p, s in zip(image_size, patch_size, stride)]))
    if global_feature_extraction == "gap":
        cfg.num_cls_tokens = 0
        cfg.pooler = AveragePooling.default_config().set(num_outputs=1)
    else:
        num_cls = 1 if global_feature_extraction == "cls_token" else 2
        seq_len += num_cls
        cfg.num_cls_tokens = encoder.num_cls_tokens = num_cls
        cfg.pooler = FirstNTokenPooling.default_config().set(num_outputs=num_cls)
    encoder.use_pos_emb = use_pos_emb
    if use_pos_emb:
        encoder.pos_emb.shape = (seq_len,)
    layer = encoder.transformer.layer
    if feed_forward_dim is not None:
        layer.feed_forward.hidden_dim = feed_forward_dim
    layer.self_attention.attention.num_heads = num_heads
    if atten_logit_cap is not None:
        layer.self_attention.attention.atten_logit_cap = atten_logit_cap
    set_dropout_rate_recursively(cfg, dropout_rate)
    if peak_stochastic_depth_rate is not None:
        encoder.transformer.peak_stochastic_depth_rate = peak_stochastic_depth_rate
    if output_proj_dim is not None:
        cfg.output_proj = Linear.default_config().set(output_dim=output_proj_dim, bias=False)
        cfg.output_proj_norm = L2Norm.default_config()


def build_vit_model_config(**kwargs) -> VisionTransformer.Config:
    """Returns a VisionTransformer config.

    Args:
        **kwargs: num_layers, model_dim, num_heads (required); feed_forward_dim (None: 4x);
            image_size (224, 224); patch_size (16, 16); stride (None: patch_size);
            global_feature_extraction ("cls_token", "cls_distill_token" or "gap"); dtype;
            dropout_rate (0.1); transformer_stack_cfg (None: stacked layers); remat (with
            transformer_stack_cfg); peak_stochastic_depth_rate; output_proj_dim (a bias-free
            projection and L2 norm of the embedding); use_pos_emb (True); atten_logit_cap.

    Returns:
        The config.

    Raises:
        ValueError: If the stride does not tile the image or the feature extraction is unknown.
    """
    cfg = VisionTransformer.default_config()
    _set_model_config(cfg, **kwargs)
    return cfg


def named_model_configs(
    *,
    extra_settings: Optional[dict[str, Any]] = None,
    include_models: Optional[list[str]] = None,
) -> dict[str, InstantiableConfig]:
    """Returns the named ViT configs.

    Args:
        extra_settings: `build_vit_model_config` arguments applied to every model.
        include_models: If set, only these names.

    Returns:
        {name: VisionTransformer config}, with "<name>-repeat" variants (repeated layers, remat)
        of H14, g14-paper, g14-clip and G14.
    """
    models = copy.deepcopy(_NAMED_VIT_MODELS)
    for name in ("H14", "g14-paper", "g14-clip", "G14"):
        models[f"{name}-repeat"] = dict(
            **models[name],
            transformer_stack_cfg=RepeatedTransformerLayer.default_config().set(
                layer=Encoder1D.default_config().transformer.layer
            ),
            remat=True,
        )
    configs = {}
    for name, settings in models.items():
        if include_models and name not in include_models:
            continue
        if extra_settings:
            settings.update(extra_settings)
        configs[name] = build_vit_model_config(**settings)
    return configs
