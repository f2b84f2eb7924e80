"""Multi-stream models: several stream encoders, then fusion networks that each give one loss.

The input batch is a nested dict that the model only adds to:
- `MultiStreamModel` calls each stream encoder (a `StreamEncoder`) and stores its output in
  `input_batch[<encoder name>]`;
- then each fusion network (a `FusionNetwork`) reads the batch and returns `(loss, outputs)`;
  the outputs are stored in `input_batch[<fusion network name>]`;
- the model's loss is the sum of the fusion losses weighted by `loss_weights` (default 1).

E.g. a CLIP-like model has "text_encoder" and "image_encoder" streams, each reading
`input_batch["input"]`, and a "contrastive_loss" fusion network reading both encoders' outputs.
Subclasses (e.g. `text_dual_encoder.TextEmbeddingDualEncoder`) may feed each encoder another part
of the batch. Stream encoder and fusion network names must be distinct.
"""

from typing import Optional

from axlearn.common.base_layer import BaseLayer
from axlearn.common.base_model import BaseModel
from axlearn.common.config import config_class
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, Tensor

__all__ = ["FusionNetwork", "MultiStreamModel", "StreamEncoder"]


class StreamEncoder(BaseLayer):
    """Encodes one input stream; `MultiStreamModel` stores its output under its name."""

    def forward(self, input_batch: NestedTensor) -> NestedTensor:
        """Encodes the stream.

        Args:
            input_batch: The stream's inputs (a part of the model's input batch).

        Returns:
            The encoder's outputs.
        """
        raise NotImplementedError(type(self))


class FusionNetwork(BaseLayer):
    """Combines the stream encoders' outputs into one loss (0 for a pure encoder) and outputs."""

    def forward(self, input_batch: NestedTensor) -> tuple[Tensor, NestedTensor]:
        """Computes the loss.

        Args:
            input_batch: The model's batch, holding every stream encoder's outputs by name.

        Returns:
            (a scalar loss, the network's outputs).
        """
        raise NotImplementedError(type(self))


class MultiStreamModel(BaseModel):
    """A model of named stream encoders and fusion networks (multi-tower or cross encoders)."""

    @config_class
    class Config(BaseModel.Config):
        """Configures MultiStreamModel."""

        # {name: config} of the stream encoders (names disjoint from fusion_network's).
        stream_encoder: dict[str, StreamEncoder.Config] = {}
        # {name: config} of the fusion networks, each giving one loss.
        fusion_network: dict[str, FusionNetwork.Config] = {}
        # {fusion network name: weight} of its loss in the total (missing names weigh 1).
        loss_weights: dict[str, float] = {}

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        shared = set(cfg.stream_encoder) & set(cfg.fusion_network)
        if shared:
            raise ValueError(
                f"{self.path()}: stream_encoder and fusion_network share names {sorted(shared)}"
            )
        self._stream_encoder = {
            name: self._add_child(name, self._overwrite_config(name, child_cfg))
            for name, child_cfg in cfg.stream_encoder.items()
        }
        self._fusion_network = {
            name: self._add_child(name, self._overwrite_config(name, child_cfg))
            for name, child_cfg in cfg.fusion_network.items()
        }

    def _overwrite_config(self, child_name: str, child_config: BaseLayer.Config):
        """Returns the config of child `child_name` (subclasses may adjust it).

        Args:
            child_name: The stream encoder's or fusion network's name.
            child_config: Its config.

        Returns:
            The config to instantiate (by default `child_config`).
        """
        del child_name
        return child_config

    def _aggregate_loss(self, losses: dict[str, Tensor]) -> Tensor:
        """The sum of the fusion networks' losses, each times its `loss_weights` entry."""
        weights = self.config.loss_weights
        loss = 0
        for name in self._fusion_network:
            loss += losses[name] * weights.get(name, 1)
        return loss

    def _forward_all_stream_encoder(self, input_batch: NestedTensor) -> NestedTensor:
        """Stores each stream encoder's outputs on `input_batch["input"]` under its name."""
        for name, encoder in self._stream_encoder.items():
            if name in input_batch:
                raise ValueError(f"{self.path()}: input_batch already holds {name!r}")
            input_batch[name] = encoder(input_batch["input"])
        return input_batch

    def forward_single_stream_encoder(
        self, input_batch: NestedTensor, encoder_name: str
    ) -> NestedTensor:
        """Runs one stream encoder (e.g. for inference).

        Args:
            input_batch: The model's input batch.
            encoder_name: The stream encoder's name.

        Returns:
            The encoder's outputs.

        Raises:
            ValueError: If there is no such encoder.
        """
        if encoder_name not in self._stream_encoder:
            raise ValueError(f"{self.path()}: {encoder_name} has not been found in stream_encoder.")
        return self._stream_encoder[encoder_name](input_batch["input"])

    def predict(self, input_batch: NestedTensor) -> NestedTensor:
        """Runs every stream encoder.

        Args:
            input_batch: The model's input batch.

        Returns:
            `input_batch` with each encoder's outputs added under its name.
        """
        return self._forward_all_stream_encoder(input_batch)

    def forward(self, input_batch: NestedTensor) -> tuple[Tensor, NestedTensor]:
        """Runs the stream encoders, then the fusion networks.

        Args:
            input_batch: The model's input batch.

        Returns:
            (the weighted sum of the fusion losses, {}); each fusion loss is also a summary
            "loss_<name>".
        """
        input_batch = self._forward_all_stream_encoder(input_batch)
        losses = {}
        for name, network in self._fusion_network.items():
            if name in input_batch:
                raise ValueError(f"{self.path()}: input_batch already holds {name!r}")
            loss, input_batch[name] = network(input_batch)
            self.add_summary(f"loss_{name}", loss)
            losses[name] = loss
        return self._aggregate_loss(losses), {}
