"""Hugging Face Llama directories from trained runs, and trainer checkpoints from them.

    export_trainer_dir("/tmp/gpt-llama", "/tmp/gpt-llama-hf")   # config.json, model.safetensors
    model = transformers.LlamaForCausalLM.from_pretrained("/tmp/gpt-llama-hf")

    import_hf_dir("/tmp/gpt-llama-hf", trainer_cfg)             # trainer_cfg.dir/checkpoints/step_0
    # then: launch_trainer_main --module=... --config=... --trainer_dir=<trainer_cfg.dir>

The weights are converted by `axlearn.common.hf_llama` and stored with the `safetensors` library:
one `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards plus the
`model.safetensors.index.json` weight map when they exceed `max_shard_bytes` (the layout that
`from_pretrained` reads). `config.json` describes a `LlamaForCausalLM` (`model_type: llama`).
When the experiment's vocabulary is a sentencepiece model, its file is copied as
`tokenizer.model` with a `tokenizer_config.json` naming `LlamaTokenizer`.

Only models that Llama can express are exported: RMSNorm pre-norm layers, RoPE on queries and
keys, SwiGLU feed-forward, no biases and no QK-norm. Anything else is refused with the config
path that differs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common.config import ConfigBase
from axlearn.common.config.paths import ConfigPathError, lookup_path
from axlearn.common.hf_llama import axlearn_to_hf_llama, hf_llama_to_axlearn
from axlearn.common.path_containment import PathContainmentError, contained_path

# The largest shard `save_hf_llama` writes by default (Hugging Face's own default is 5 GB).
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"


class HfConversionError(ValueError):
    """The model cannot be expressed as a Hugging Face Llama model (or the directory is bad)."""


def _get(cfg: Any, path: str, default: Any = KeyError) -> Any:
    """The value at dotted `path` of a config (`config.paths.lookup_path`), else `default`."""
    try:
        return lookup_path(cfg, path)
    except ConfigPathError as e:
        if default is KeyError:
            raise HfConversionError(f"The model config has no field {path}.") from e
        return default


def _klass_name(cfg: Any) -> str:
    klass = getattr(cfg, "klass", None)
    return getattr(klass, "__name__", type(cfg).__name__)


def llama_config(model_cfg: ConfigBase, *, tied: bool, importing: bool = False) -> dict[str, Any]:
    """The `config.json` of the Llama model equivalent to `model_cfg` (a causal_lm.Model config).

    Args:
        model_cfg: The model config (`trainer_config.model`).
        tied: Whether the LM head is the token embedding.
        importing: Whether the message of a refusal speaks of importing Llama weights into the
            experiment (and names the --config_override that removes a QK-norm) or of exporting.

    Returns:
        The config dict.

    Raises:
        HfConversionError: Naming the config path of a feature Llama lacks.
    """
    layer = "decoder.transformer.layer"
    attn = f"{layer}.self_attention.attention"
    problems = []
    for path in (f"{attn}.query_scale.norm", f"{attn}.key_scale.norm"):
        if _get(model_cfg, path, None) is not None:
            problems.append(f"{path} is set (QK-norm has no Llama counterpart)")
    activation = tuple(_get(model_cfg, f"{layer}.feed_forward.activation", ()))
    if activation not in (("nn.silu", "linear"), ("nn.swish", "linear")):
        problems.append(f"{layer}.feed_forward.activation is {activation}, Llama needs SwiGLU")
    for path in (f"{layer}.self_attention.structure", f"{layer}.feed_forward.structure"):
        if _get(model_cfg, path, "prenorm") != "prenorm":
            problems.append(f"{path} is {_get(model_cfg, path)!r}, Llama needs 'prenorm'")
    for path in (
        "decoder.output_norm",
        f"{layer}.self_attention.norm",
        f"{layer}.feed_forward.norm",
    ):
        if _klass_name(_get(model_cfg, path)) != "RMSNorm":
            problems.append(
                f"{path} is a {_klass_name(_get(model_cfg, path))}, Llama needs RMSNorm"
            )
    if _get(model_cfg, f"{attn}.input_linear.rotary_value", False):
        problems.append(f"{attn}.input_linear.rotary_value is True")
    theta = _get(model_cfg, f"{attn}.input_linear.rope_pos_emb_layer.theta", None)
    if theta is None:
        problems.append(f"{attn}.input_linear has no RoPE (rope_pos_emb_layer.theta)")
    if problems:
        if importing:
            fixes = [
                f"--config_override=model.{p.split(' ')[0]}=None"
                for p in problems
                if "QK-norm" in p
            ]
            hint = (
                f" Pass {' '.join(fixes)} to make the experiment's model a Llama." if fixes else ""
            )
            raise HfConversionError(
                "Llama weights cannot be imported into the experiment's model: "
                + "; ".join(problems)
                + "."
                + hint
            )
        raise HfConversionError(
            "The model cannot be exported as a Hugging Face Llama model:\n  "
            + "\n  ".join(problems)
        )
    num_heads = int(_get(model_cfg, f"{attn}.num_heads"))
    num_kv_heads = _get(model_cfg, f"{attn}.input_linear.input_linear.num_kv_heads", None)
    dim = int(_get(model_cfg, "decoder.dim"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(_get(model_cfg, "decoder.vocab_size")),
        "hidden_size": dim,
        "intermediate_size": int(_get(model_cfg, f"{layer}.feed_forward.hidden_dim")),
        "num_hidden_layers": int(_get(model_cfg, "decoder.transformer.num_layers")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(num_kv_heads or num_heads),
        "head_dim": dim // num_heads,
        "hidden_act": "silu",
        "rms_norm_eps": float(_get(model_cfg, "decoder.output_norm.eps")),
        "rope_theta": float(theta),
        "max_position_embeddings": 8192,
        "tie_word_embeddings": bool(tied),
        "attention_bias": False,
        "mlp_bias": False,
        "pad_token_id": int(_get(model_cfg, "decoder.pad_token_id", 0)),
        "eos_token_id": int(_get(model_cfg, "decoder.eos_token_id", 1)),
        "bos_token_id": None,
        "torch_dtype": "float32",
    }


# Records which files an export wrote into its directory (so a later `overwrite` export replaces
# or removes those and nothing else).
EXPORT_MANIFEST_FILE = ".axlearn_hf_export.json"
# The largest export manifest read.
_MAX_MANIFEST_BYTES = 1 << 20


def save_hf_llama(
    params: Any,
    model_cfg: ConfigBase,
    output_dir: str,
    *,
    sentencepiece_model_file: Optional[str] = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
) -> list[str]:
    """Writes `params` of `model_cfg` as a Hugging Face Llama directory.

    Every file is written into a fresh private temporary directory beside `output_dir`, then
    published by rename (`publish_export`): a missing or empty `output_dir` is replaced whole; a
    non-empty one needs `overwrite`, and even then only the files an earlier export recorded in
    its `EXPORT_MANIFEST_FILE` are replaced or removed (any other file is kept, and one with a
    name this export writes is refused). Nothing is written through a link; every file gets
    mode 0644 (less the umask).

    Args:
        params: The model parameter tree (host or device arrays).
        model_cfg: The model config.
        output_dir: The directory.
        sentencepiece_model_file: If set, copied as `tokenizer.model` (with tokenizer configs).
        max_shard_bytes: The largest safetensors file; larger models are sharded.
        overwrite: Whether a non-empty `output_dir` may be updated (see above).

    Returns:
        The written file names.

    Raises:
        HfConversionError: If the model has no Llama equivalent, or `output_dir` cannot be
            written under the rules above (the message names the file and the fix).
    """
    from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel

    params = jax.device_get(params)
    flat_paths = [
        "/".join(str(getattr(k, "key", k)) for k in path)
        for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    ]
    tied = "decoder/lm_head/weight" not in flat_paths
    config = llama_config(model_cfg, tied=tied)
    try:
        state_dict = axlearn_to_hf_llama(
            params,
            num_heads=config["num_attention_heads"],
            num_kv_heads=config["num_key_value_heads"],
            include_tied_lm_head=False,
        )
    except ValueError as e:
        raise HfConversionError(str(e)) from e
    check_export_target(output_dir, overwrite=overwrite)  # Before the weights are written.
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for key in sorted(state_dict):
        value = np.ascontiguousarray(state_dict[key])
        if sizes[-1] and sizes[-1] + value.nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][key] = value
        sizes[-1] += value.nbytes

    def write(tmp: str) -> list[str]:
        written = []
        metadata = {"format": "pt"}
        if len(shards) == 1:
            save_file(shards[0], os.path.join(tmp, SAFETENSORS_FILE), metadata=metadata)
            written.append(SAFETENSORS_FILE)
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, os.path.join(tmp, name), metadata=metadata)
                weight_map.update({key: name for key in shard})
                written.append(name)
            index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
            _write_json(os.path.join(tmp, SAFETENSORS_INDEX_FILE), index, indent=2)
            written.append(SAFETENSORS_INDEX_FILE)
        _write_json(os.path.join(tmp, "config.json"), config, indent=2)
        generation = {
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": config["pad_token_id"],
        }
        _write_json(os.path.join(tmp, "generation_config.json"), generation)
        written += ["config.json", "generation_config.json"]
        if sentencepiece_model_file:
            written += _write_sentencepiece_tokenizer(sentencepiece_model_file, tmp)
        return written

    return publish_export(output_dir, write, overwrite=overwrite)


def _write_json(path: str, value: Any, *, indent: Optional[int] = None) -> None:
    # Only ever called inside a fresh private temporary directory (no one else's entries).
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import file_access

    data = json.dumps(value, indent=indent, sort_keys=True).encode("utf-8")
    file_access.write_atomic(os.path.dirname(path), os.path.basename(path), data)


def _umask() -> int:
    """This process's umask (exported files get 0644 and the directory 0755, less it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _previous_export(output_dir: str) -> set[str]:
    """The files an earlier export recorded in `output_dir`'s manifest (empty: none)."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import file_access

    try:
        manifest = file_access.read_json(
            output_dir, EXPORT_MANIFEST_FILE, max_bytes=_MAX_MANIFEST_BYTES, max_depth=4
        )
    except file_access.FileMissingError:
        return set()
    except file_access.FileAccessError as e:
        raise HfConversionError(
            f"{e}; remove {EXPORT_MANIFEST_FILE} (and the files of the earlier export) or "
            "choose another --output"
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not all(
        isinstance(f, str) and f and "/" not in f and f not in (".", "..") for f in files
    ):
        raise HfConversionError(
            f"{os.path.join(output_dir, EXPORT_MANIFEST_FILE)}: field 'files' must be a list of "
            "file names; remove it (and the files of the earlier export) or choose another "
            "--output"
        )
    return set(files)


def check_export_target(output_dir: str, *, overwrite: bool) -> None:
    """Refuses an export target that `publish_export` would refuse (before any work is done).

    Args:
        output_dir: The directory to export to.
        overwrite: Whether a non-empty directory may be updated.

    Raises:
        HfConversionError: If `output_dir` is not a directory, or is non-empty without
            `overwrite` (the message says what to do).
    """
    if not os.path.lexists(output_dir):
        return
    if os.path.islink(output_dir) and not os.path.isdir(output_dir):
        raise HfConversionError(
            f"--output {output_dir} is a symbolic link to no directory; remove it or choose "
            "another --output"
        )
    if not os.path.isdir(output_dir):
        raise HfConversionError(f"--output {output_dir} exists and is not a directory")
    entries = os.listdir(output_dir)
    if entries and not overwrite:
        raise HfConversionError(
            f"--output {output_dir} is not empty ({len(entries)} entries); pass --overwrite to "
            "replace the files an earlier export wrote there (other files are kept), or choose "
            "a new directory"
        )
    if entries:
        _previous_export(output_dir)  # Validates the manifest.


def publish_export(output_dir: str, write: Any, *, overwrite: bool) -> list[str]:
    """Runs `write(tmp_dir)` in a fresh temporary directory beside `output_dir`, then publishes.

    A missing or empty `output_dir` is replaced by the temporary directory (one rename). A
    non-empty one (only with `overwrite`) gets each written file by rename, relative to a
    descriptor of `output_dir` (a link under a written name is replaced, its target untouched);
    then the files the earlier export's manifest lists and this one did not write are removed.
    A file of a name this export writes that no earlier export recorded is refused, before
    anything changes. The manifest records this export's files.

    Args:
        output_dir: The destination directory.
        write: fn(tmp_dir) -> the names of the files it wrote there.
        overwrite: Whether a non-empty `output_dir` may be updated.

    Returns:
        The written file names.

    Raises:
        HfConversionError: Naming the file and the fix when the rules above refuse.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import file_access

    check_export_target(output_dir, overwrite=overwrite)
    output_dir = os.path.abspath(output_dir)
    parent, name = os.path.split(output_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.export-", dir=parent)  # Mode 0700: ours alone.
    try:
        written = list(write(tmp))
        manifest = {"files": sorted(written)}
        _write_json(os.path.join(tmp, EXPORT_MANIFEST_FILE), manifest)
        mode = 0o644 & ~_umask()
        for entry in [*written, EXPORT_MANIFEST_FILE]:
            os.chmod(os.path.join(tmp, entry), mode)
        os.chmod(tmp, 0o755 & ~_umask())
        if not os.path.lexists(output_dir) or (
            os.path.isdir(output_dir)
            and not os.path.islink(output_dir)
            and not os.listdir(output_dir)
        ):
            try:
                os.rename(tmp, output_dir)  # Onto nothing or an empty directory: atomic.
                return written
            except OSError as e:
                if not os.path.isdir(output_dir):
                    raise HfConversionError(
                        f"--output {output_dir}: cannot be created ({e.strerror})"
                    ) from None
                # Something appeared there meanwhile: update it file by file below, if allowed.
                check_export_target(output_dir, overwrite=overwrite)
        previous = _previous_export(output_dir)
        with file_access.RunDir(output_dir) as root:
            present = set(file_access.listdir(root))
            foreign = sorted((set(written) & present) - previous)
            if foreign:
                raise HfConversionError(
                    f"{os.path.join(output_dir, foreign[0])} was not written by hf export (no "
                    f"earlier export recorded it in {EXPORT_MANIFEST_FILE}); move it away or "
                    "choose another --output"
                )
            tmp_fd = file_access.open_dir(tmp)
            try:
                for entry in [*written, EXPORT_MANIFEST_FILE]:
                    os.rename(entry, entry, src_dir_fd=tmp_fd, dst_dir_fd=root.fd)
            finally:
                os.close(tmp_fd)
            for entry in sorted((previous - set(written)) & present):
                try:
                    file_access.remove(root, entry)
                except file_access.FileAccessError:
                    pass  # Not a regular file now: not ours to delete.
        return written
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_sentencepiece_tokenizer(model_file: str, output_dir: str) -> list[str]:
    """Copies a sentencepiece model as `tokenizer.model` with configs for `LlamaTokenizer`."""
    import sentencepiece  # pylint: disable=import-outside-toplevel

    sp = sentencepiece.SentencePieceProcessor(model_file=model_file)

    def piece(i: int) -> Optional[str]:
        return sp.id_to_piece(i) if 0 <= i < sp.get_piece_size() else None

    shutil.copyfile(model_file, os.path.join(output_dir, "tokenizer.model"))
    tokenizer_config = {
        "tokenizer_class": "LlamaTokenizer",
        # Our inputs carry no BOS and end with EOS only as a target; prompts get neither.
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": piece(sp.bos_id()),
        "eos_token": piece(sp.eos_id()),
        "unk_token": piece(sp.unk_id()),
        "pad_token": piece(sp.pad_id()),
        "legacy": False,
        "clean_up_tokenization_spaces": False,
    }
    _write_json(os.path.join(output_dir, "tokenizer_config.json"), tokenizer_config, indent=2)
    return ["tokenizer.model", "tokenizer_config.json"]


def load_hf_state_dict(hf_dir: str) -> dict[str, np.ndarray]:
    """Reads the weights of a Hugging Face directory (one safetensors file or an index).

    Every file named by the index's `weight_map` must lie inside `hf_dir` (the rule of
    `axlearn.common.path_containment`; the file itself may be a link, as in the Hugging Face
    cache), and each safetensors header is checked against its file's size before any weight
    is read.

    Args:
        hf_dir: The directory.

    Returns:
        {key: NumPy array}.

    Raises:
        HfConversionError: If the directory has neither `model.safetensors` nor an index, if the
            index is malformed or names a file outside `hf_dir`, or if a weight file is not a
            valid safetensors file (each naming the file).
    """
    single = os.path.join(hf_dir, SAFETENSORS_FILE)
    index_path = os.path.join(hf_dir, SAFETENSORS_INDEX_FILE)
    if os.path.exists(single):
        return _load_safetensors(single)
    if os.path.exists(index_path):
        state_dict: dict[str, np.ndarray] = {}
        for name in _weight_files(hf_dir, index_path):
            state_dict.update(_load_safetensors(name))
        return state_dict
    raise HfConversionError(
        f"{hf_dir} has neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX_FILE} (only safetensors "
        "weights are read; convert .bin files with transformers' save_pretrained first)."
    )


# The largest safetensors header read (the safetensors library's own limit is 100 MB).
_MAX_SAFETENSORS_HEADER_BYTES = 100 * 2**20
# The largest weight index read.
_MAX_INDEX_BYTES = 100 * 2**20


# The largest config.json read (a Llama config is about 1 KB).
_MAX_CONFIG_BYTES = 1 << 20


def _link_target(directory: str, name: str) -> tuple[str, str]:
    """(root, name) to open `directory/name` by, following it once if it is a symbolic link.

    The Hugging Face cache links each file of a snapshot into its blob store: that one link is
    followed (by reading it, not by resolving the whole path), and its target is then opened by
    the file rule from its own directory (no further link followed, regular files only).

    Args:
        directory: The directory `name` is in.
        name: The file's name (no directory part).

    Returns:
        `(directory, name)`, or the link target's directory and name.
    """
    path = os.path.join(directory, name)
    if not os.path.islink(path):
        return directory, name
    target = os.path.normpath(os.path.join(directory, os.readlink(path)))
    return os.path.dirname(target), os.path.basename(target)


def _read_hf_json(hf_dir: str, name: str, *, max_bytes: int) -> Any:
    """Reads `hf_dir/name` as JSON, bounded in size and nesting, through the file layer.

    No link is followed below `hf_dir`, except that the file itself may be one (the Hugging
    Face cache links each file into its blob store): then its target is opened, as a regular
    file only (a FIFO is refused without blocking) and read within the same bounds.

    Args:
        hf_dir: The Hugging Face directory.
        name: The file's name in it.
        max_bytes: The most bytes the file may hold.

    Returns:
        The parsed JSON value.

    Raises:
        HfConversionError: One line naming the file and the rule broken.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import file_access

    path = os.path.join(hf_dir, name)
    try:
        root, rel = _link_target(hf_dir, name)
        data = file_access.read_bytes(root, rel, max_bytes=max_bytes)
        return file_access.parse_json(data, path, max_depth=16)
    except file_access.FileMissingError:
        raise HfConversionError(f"{path} does not exist") from None
    except OSError as e:
        raise HfConversionError(f"{e}; fix or replace the Hugging Face directory") from None


def _weight_files(hf_dir: str, index_path: str) -> list[str]:
    """The weight files of `index_path`'s `weight_map`, each checked to lie inside `hf_dir`."""
    index = _read_hf_json(hf_dir, SAFETENSORS_INDEX_FILE, max_bytes=_MAX_INDEX_BYTES)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise HfConversionError(
            f"{index_path} has no `weight_map` object ({{weight key: safetensors file}}); "
            "rewrite it with transformers' save_pretrained, or keep a single model.safetensors."
        )
    files = {}
    for key, name in sorted(weight_map.items()):
        try:
            path = contained_path(
                hf_dir,
                name,
                source=index_path,
                what=f"weight_map entry {key!r:.100}",
                follow_final_link=True,
            )
        except PathContainmentError as e:
            raise HfConversionError(str(e)) from e
        files.setdefault(name, path)
    return [files[name] for name in sorted(files)]


def _check_safetensors_header(path: str) -> None:
    """Checks a safetensors file's header against the file's size before anything is read."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import file_access

    try:
        # The file layer refuses a FIFO (or any non-regular file) without blocking.
        fd = file_access.open_fd(*_link_target(os.path.dirname(path), os.path.basename(path)))
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, 8, 0)
            if len(head) < 8:
                raise HfConversionError(
                    f"{path} is not a safetensors file: {size} bytes, shorter than the 8-byte "
                    "header length (truncated?)"
                )
            header_len = int.from_bytes(head, "little")
            if header_len > _MAX_SAFETENSORS_HEADER_BYTES or 8 + header_len > size:
                raise HfConversionError(
                    f"{path}: its header claims {header_len} bytes but the file has {size} "
                    "(truncated, or not a safetensors file)"
                )
            header = json.loads(os.pread(fd, header_len, 8).decode("utf-8"))
        finally:
            os.close(fd)
    except OSError as e:
        raise HfConversionError(f"{path} cannot be read: {e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HfConversionError(f"{path}: its safetensors header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise HfConversionError(f"{path}: its safetensors header is not a JSON object")
    data_size = size - 8 - header_len
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        valid = (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size
        )
        if not valid:
            raise HfConversionError(
                f"{path}: tensor {key!r:.100} claims the bytes {offsets!r:.60} of a "
                f"{data_size}-byte data section (the file is truncated or its header is wrong)"
            )


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads one safetensors file, any failure an `HfConversionError` naming it."""
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    _check_safetensors_header(path)
    try:
        return load_file(path)
    except Exception as e:  # pylint: disable=broad-except
        raise HfConversionError(
            f"{path} is not a valid safetensors file ({type(e).__name__}: {str(e)[:200]})"
        ) from e


def check_hf_config(hf_dir: str, model_cfg: ConfigBase) -> None:
    """Checks that `hf_dir/config.json` describes the same architecture as `model_cfg`.

    Raises:
        HfConversionError: Naming each field that differs.
    """
    path = os.path.join(hf_dir, "config.json")
    theirs = _read_hf_json(hf_dir, "config.json", max_bytes=_MAX_CONFIG_BYTES)
    if not isinstance(theirs, dict):
        raise HfConversionError(f"{path} is not a JSON object")
    if theirs.get("model_type") != "llama":
        raise HfConversionError(f"{path}: model_type is {theirs.get('model_type')!r}, not 'llama'")
    ours = llama_config(
        model_cfg, tied=bool(theirs.get("tie_word_embeddings", False)), importing=True
    )
    keys = [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
    ]
    diffs = [
        f"{k}: {theirs.get(k)} there, {ours[k]} in the experiment"
        for k in keys
        if theirs.get(k) != ours[k]
    ]
    for key in ("rope_theta", "rms_norm_eps"):
        if key in theirs and not np.isclose(float(theirs[key]), ours[key]):
            diffs.append(f"{key}: {theirs[key]} there, {ours[key]} in the experiment")
    if diffs:
        raise HfConversionError(
            f"{path} does not match the experiment's model:\n  " + "\n  ".join(diffs)
        )


def hf_params_for_model(state_dict: Mapping[str, np.ndarray], *, target: Any) -> Any:
    """Converts a Hugging Face Llama state dict into the parameter tree shaped like `target`.

    Args:
        state_dict: From `load_hf_state_dict`.
        target: The model's parameter tree of arrays or ShapeDtypeStructs.

    Returns:
        NumPy parameters in `target`'s structure and dtypes.

    Raises:
        HfConversionError: If a key is missing or a shape differs.
    """
    try:
        return hf_llama_to_axlearn(state_dict, target=target)
    except (KeyError, ValueError) as e:
        raise HfConversionError(str(e).strip("'\"")) from e


def export_trainer_dir(
    trainer_dir: str,
    output_dir: str,
    *,
    step: Optional[int] = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
    module: Optional[str] = None,
) -> tuple[int, list[str]]:
    """Exports a trained run's checkpoint as a Hugging Face Llama directory.

    Args:
        trainer_dir: The run's trainer dir.
        output_dir: The Hugging Face directory to write.
        step: The checkpoint step; None: the latest.
        max_shard_bytes: See `save_hf_llama`.
        overwrite: See `save_hf_llama` (a non-empty `output_dir` is refused without it).
        module: The run's experiment module as the user named it (`--module`); a record's
            module outside `axlearn.experiments` is imported only when it is this one.

    Returns:
        (the exported step, the written file names).

    Raises:
        HfConversionError: If the model has no Llama equivalent.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.inference import InferenceRunner, sentencepiece_model_file

    check_export_target(output_dir, overwrite=overwrite)  # Before reading the run.
    runner = InferenceRunner.from_trainer_dir(trainer_dir, evalers=[], step=step, module=module)
    # Refuse before reading the checkpoint if the architecture cannot be expressed.
    tied = "lm_head" not in runner.model.decoder.children
    llama_config(runner.config.model, tied=tied)
    restored = runner.restore(step)
    written = save_hf_llama(
        runner.params,
        runner.config.model,
        output_dir,
        sentencepiece_model_file=sentencepiece_model_file(runner.trainer_config),
        max_shard_bytes=max_shard_bytes,
        overwrite=overwrite,
    )
    return restored, written


def import_hf_dir(hf_dir: str, trainer_cfg: ConfigBase, *, seed: int = 0) -> str:
    """Writes a trainer checkpoint at step 0 whose model parameters are those of `hf_dir`.

    The optimizer state is initialized for the imported parameters (as at the start of
    training); `launch_trainer_main` with the same experiment and trainer dir restores it and
    fine-tunes from there.

    Args:
        hf_dir: A Hugging Face Llama directory (safetensors weights).
        trainer_cfg: The experiment's trainer config, its `dir` set to the new trainer dir.
        seed: The seed of the trainer state's PRNG key (as `--trainer_prng_seed`).

    Returns:
        The written step directory.

    Raises:
        HfConversionError: If the directory does not match the experiment's model.
        ValueError: If the trainer dir already holds a committed checkpoint.
    """
    # pylint: disable=import-outside-toplevel,protected-access
    from axlearn.common.checkpointer import layout

    check_hf_config(hf_dir, trainer_cfg.model)
    state_dict = load_hf_state_dict(hf_dir)
    trainer = trainer_cfg.instantiate(parent=None)
    existing = layout.latest_checkpoint_step(trainer.checkpointer.config.dir)
    if existing is not None:
        raise ValueError(
            f"{trainer.checkpointer.config.dir} already holds a committed checkpoint (step "
            f"{existing}); import into a new trainer dir."
        )
    target = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(tuple(s.shape), s.dtype),
        trainer.trainer_state_specs.model,
        is_leaf=lambda x: hasattr(x, "mesh_axes"),
    )
    params = hf_params_for_model(state_dict, target=target)
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.finetune import save_initial_state

    return save_initial_state(trainer, params, seed=seed)
