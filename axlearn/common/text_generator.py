"""TextGenerator: text in, text out, with an InferenceRunner's causal LM and the experiment's
vocabulary; and finding that vocabulary in a trainer config.

    generator = TextGenerator.from_runner(InferenceRunner.from_trainer_dir("/tmp/gpt-tiny"))
    print(generator.sample(["The Python"], max_new_tokens=40, seed=0)[0])

Re-exported from `axlearn.common.inference`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Optional, Protocol

from axlearn.common.config import ConfigBase


class DecodeRunner(Protocol):
    """What a TextGenerator uses of its runner (`axlearn.common.inference.InferenceRunner`).

    Declared here so that this module, which `axlearn.common.inference` re-exports, needs
    nothing from it.
    """

    # The decoder's EOS id (the prompt token).
    eos_token_id: int
    # The run's trainer config (searched for the input's vocabulary).
    trainer_config: Any

    def sample_decode(self, prompts: Sequence[Sequence[int]], **kwargs) -> list:
        """Sampled continuations (token ids) of each prompt."""

    def beam_search_decode(self, prompts: Sequence[Sequence[int]], **kwargs) -> list:
        """Beam search outputs (with `.tokens`) of each prompt."""

    def stream_sample(self, prompt: Sequence[int], **kwargs) -> Iterator[int]:
        """Yields sampled token ids one at a time."""


def find_text_source(trainer_cfg: Any) -> Optional[ConfigBase]:
    """The first input source config of a trainer config that has a `vocab_cfg` field.

    The training input is searched first, then the evalers' inputs.

    Args:
        trainer_cfg: The trainer config (or None).

    Returns:
        The source config (with `vocab_cfg` and possibly `replace_newlines_with`), or None.
    """
    found: list[ConfigBase] = []

    def visit(node: Any) -> None:
        if found:
            return
        if isinstance(node, dict):
            for value in node.values():
                visit(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                visit(value)
        elif isinstance(node, ConfigBase):
            if "vocab_cfg" in node and node.vocab_cfg is not None:
                found.append(node)
                return
            for key in node.keys():
                visit(getattr(node, key))

    if trainer_cfg is not None:
        visit(trainer_cfg.input)
        visit(trainer_cfg.evalers)
    return found[0] if found else None


def sentencepiece_model_file(trainer_cfg: Any) -> Optional[str]:
    """The sentencepiece model file of a trainer config's vocabulary, if it has one.

    Args:
        trainer_cfg: The trainer config (or None).

    Returns:
        The file path, or None (no vocabulary found, or not a sentencepiece one).
    """
    source = find_text_source(trainer_cfg)
    if source is None:
        return None
    vocab = source.vocab_cfg.instantiate()
    return getattr(vocab, "sentencepiece_model_file", None)


class TextGenerator:
    """Text in, text out, with an InferenceRunner's causal LM and the experiment's vocabulary.

    A prompt is encoded as [prompt token] + vocab.encode(text), the prompt token being the
    decoder's EOS id (the experiments' documents start with it); newlines are mapped to the
    input's `replace_newlines_with` piece and back.
    """

    def __init__(
        self,
        runner: DecodeRunner,
        vocab: Any,
        *,
        replace_newlines_with: str = "\n",
    ):
        self._runner = runner
        self._vocab = vocab
        self._newline = replace_newlines_with
        self._prompt_token = runner.eos_token_id

    @classmethod
    def from_runner(cls, runner: DecodeRunner) -> TextGenerator:
        """The generator of a runner built by `InferenceRunner.from_trainer_dir`.

        Raises:
            ValueError: If the run's config has no input with a vocabulary.
        """
        source = find_text_source(runner.trainer_config)
        if source is None:
            raise ValueError("The run's config has no input with a vocab_cfg to tokenize with.")
        newline = (
            getattr(source, "replace_newlines_with", None)
            if "replace_newlines_with" in source
            else None
        )
        return cls(runner, source.vocab_cfg.instantiate(), replace_newlines_with=newline or "\n")

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt: the prompt token, then the text's tokens."""
        ids = self._vocab.encode(text.replace("\n", self._newline))
        return [self._prompt_token] + [int(i) for i in ids]

    def continuation(self, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
        """The text that `new_ids` adds after `prompt_ids` (spacing as in the full text)."""
        body = [int(i) for i in prompt_ids[1:]]
        prefix = self._vocab.decode(body) if body else ""
        full = self._vocab.decode(body + [int(i) for i in new_ids])
        text = full[len(prefix) :] if full.startswith(prefix) else self._vocab.decode(list(new_ids))
        return text.replace(self._newline, "\n")

    def sample(self, prompts: Sequence[str], **kwargs) -> list[str]:
        """Continuations of `prompts` by `InferenceRunner.sample_decode` (same keywords)."""
        ids = [self.encode(p) for p in prompts]
        outputs = self._runner.sample_decode(ids, **kwargs)
        return [self.continuation(p, o) for p, o in zip(ids, outputs)]

    def beam_search(self, prompts: Sequence[str], **kwargs) -> list[str]:
        """The best beam's continuation of each prompt (`InferenceRunner.beam_search_decode`)."""
        ids = [self.encode(p) for p in prompts]
        outputs = self._runner.beam_search_decode(ids, **kwargs)
        return [self.continuation(p, o.tokens) for p, o in zip(ids, outputs)]

    def stream(self, prompt: str, **kwargs) -> Iterator[str]:
        """Yields the continuation's text piece by piece as tokens are sampled.

        The pieces join to `sample([prompt], **kwargs)[0]` (same seed, same tokens).
        """
        ids = self.encode(prompt)
        new: list[int] = []
        shown = ""
        for token in self._runner.stream_sample(ids, **kwargs):
            new.append(token)
            text = self.continuation(ids, new)
            # Hold back a trailing replacement character (a partial multi-byte piece).
            if text.startswith(shown) and not text.endswith("\ufffd"):
                yield text[len(shown) :]
                shown = text
        text = self.continuation(ids, new)
        if text.startswith(shown) and len(text) > len(shown):
            yield text[len(shown) :]
