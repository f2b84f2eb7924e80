"""Runs the code of AXLearn's getting-started pages against this package.

AXLearn's `docs/01-start.md` and `docs/02-concepts.md` are read from a folder given on the
command line (default: ../shared/reference/axlearn_docs next to the repository); nothing of them
is copied into the repository. Everything runs in a scratch folder outside the repository:

- every ```python block, and every ```diff block of Python code (its new text: `+` lines kept,
  `-` lines dropped), in a fresh namespace in one worker process per page (02-concepts: in one
  namespace, in page order, as a reader follows the page). Names the page uses without importing
  them are imported from the AXLearn modules that define them (`AXLEARN_NAMES`), as a reader
  would. `...` in a signature becomes `*args, **kwargs`; `...` arguments of calls are dropped.
  After a block defines `resnet_imagenet_trainer`, the function is called.
- the tutorial assembled from the 01-start blocks (each statement of the function body once, in
  page order, the alternative blocks that remove lines left out) as `tutorial.py`: its
  `named_trainer_configs()["ResNet-50"]` is built, then trained for a few steps on CPU with
  fake images by `launch_trainer_main --module=tutorial --data_dir=FAKE` (with
  `--config_override`s that shrink it, see TRAIN_OVERRIDES).
- the local CLI examples: each `axlearn gcp launch start` block, run by bash as written with
  `--dry_run` (and `--skip_preflight` unless --preflight) added, with a scratch HOME holding an
  active GCP config and a scratch git repository with a Dockerfile.

Each block gets a status: "ran" (it ran to the end), "placeholder" (it stopped at something the
page leaves out: a name it never defines (replaced by a stub), a `...` argument, code another
block holds ("Other code redacted")), "failed" (anything else: an error of this package), or
"not run" (shell commands that need the network, gcloud, or AXLearn's own repository). ok is
false only for "failed".

Usage (from the repository root):
    python benchmarks/axlearn_docs_check.py [DOCS_DIR] [--output results.json] [--preflight]

Prints a JSON list of {page, block, line, kind, status, ok, error}; exits 1 if any block failed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import traceback
from typing import Any, Optional

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ("01-start.md", "02-concepts.md")

# Where AXLearn defines the names its pages use without importing them.
AXLEARN_NAMES = {
    "TransformerAttentionLayer": "axlearn.common.attention",
    "GroupedQueryAttention": "axlearn.common.attention",
    "StackedTransformerLayer": "axlearn.common.attention",
    "TransformerLayer": "axlearn.common.attention",
    "MultiheadAttention": "axlearn.common.attention",
    "RMSNorm": "axlearn.common.layers",
    "LayerNorm": "axlearn.common.layers",
    "Linear": "axlearn.common.layers",
    "config_for_class": "axlearn.common.config",
    "config_for_function": "axlearn.common.config",
    "config_class": "axlearn.common.config",
    "REQUIRED": "axlearn.common.config",
    "Required": "axlearn.common.config",
    "InstantiableConfig": "axlearn.common.config",
    "Module": "axlearn.common.module",
    "Tensor": "axlearn.common.utils",
}

# Shrinks the tutorial's ResNet-50 trainer for a few CPU steps (the config names stay the page's).
TRAIN_OVERRIDES = (
    "mesh_axis_names=('data', 'model')",
    "mesh_shape=(-1, 1)",
    "max_step=2",
    "model.backbone.hidden_dim=4",
    "model.backbone.num_blocks_per_stage=[1]",
    "input.batcher.global_batch_size=8",
    "input.processor.image_size=(16, 16)",
    "evalers.eval_validation.input.batcher.global_batch_size=8",
    "evalers.eval_validation.input.processor.image_size=(16, 16)",
    "evalers.eval_validation.eval_policy.n=2",
    "checkpointer.save_policy.n=2",
    "learner.optimizer.learning_rate.max_step=2",
    "learner.optimizer.learning_rate.warmup_steps=1",
)

# Statements of the page that it takes back: the ImageNetV2 example ("For now, let's stick to the
# original imagenet2012").
TAKEN_BACK = ("input_cfg.source.dataset_name = 'imagenet_v2/matched-frequency'",)

# The scratch HOME's active GCP config for the launch examples (contacts nothing in --dry_run).
GCP_CONFIG = """\
[gcp."my-project:us-central2-b"]
project = "my-project"
zone = "us-central2-b"
permanent_bucket = "my-permanent"
docker_repo = "us-docker.pkg.dev/my-project/axlearn"
labels = "v4"

[gcp]
_active = "my-project:us-central2-b"
"""


def extract_blocks(text: str) -> list[dict[str, Any]]:
    """Returns the fenced code blocks of a markdown page.

    Args:
        text: The page.

    Returns:
        [{"kind": language, "line": 1-based line of the fence, "code": text}].
    """
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = re.match(r"^```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        blocks.append({"kind": match.group(1) or "text", "line": start, "code": "\n".join(body)})
        i += 1
    return blocks


def diff_new_text(code: str) -> tuple[str, bool]:
    """The new text of a diff block: '+' lines without the '+', '-' lines dropped.

    The pages' diffs have no column for unchanged lines, and write `+   x` (3 spaces) for a line
    indented by 4: such indents are rounded up to a multiple of 4.

    Returns:
        (the text, whether the diff removes lines: an alternative to what came before).
    """
    out, removes = [], False
    for line in code.splitlines():
        if line.startswith("-"):
            removes = True
            continue
        if line.startswith("+"):
            line = line[1:]
            # The pages write `+   x` for a 4-space indented `x`: round 3 spaces up to 4.
            indent = len(line) - len(line.lstrip(" "))
            if indent % 4 == 3:
                line = " " + line
        out.append(line)
    return "\n".join(out), removes


def _is_python(code: str) -> bool:
    return bool(re.search(r"^\s*(from \S+ import|import \S+|def |class )", code, re.M))


def _fix_elisions(code: str) -> tuple[str, set[int]]:
    """Makes a page's elisions valid Python; returns the code and the 1-based lines changed.

    `def f(a, ...):` -> `def f(a, *args, **kwargs):`; a `...` argument after keyword arguments
    (`f(x=1, ...)`, or a line holding only `...,`) is dropped.
    """
    out, changed, previous = [], set(), ""
    for number, line in enumerate(code.splitlines(), start=1):
        new = re.sub(r"(def \w+\([^)]*?),\s*\.\.\.\s*\)", r"\1, *args, **kwargs)", line)
        if new == line and re.search(r"=.*,\s*\.\.\.\s*\)", line):
            new = re.sub(r",\s*\.\.\.\s*\)", ")", line)
        if re.fullmatch(r"\s*\.\.\.,\s*", line) or (
            re.fullmatch(r"\s*\.\.\.\s*", line) and previous.rstrip().endswith(",")
        ):
            new = ""
        if new != line:
            changed.add(number)
        out.append(new)
        if line.strip():
            previous = line
    return "\n".join(out), changed


class _DropEllipsisArgs(ast.NodeTransformer):
    """Drops `...` arguments of calls and records the lines of those calls."""

    def __init__(self):
        self.lines: set[int] = set()

    def visit_Call(self, node: ast.Call) -> ast.Call:  # pylint: disable=invalid-name
        self.generic_visit(node)
        kept = [a for a in node.args if not (isinstance(a, ast.Constant) and a.value is ...)]
        if len(kept) != len(node.args):
            self.lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            node.args = kept
        return node


def _function_body(tree: ast.Module, name: str) -> list[ast.stmt]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.body
    return []


def assemble_tutorial(blocks: list[dict[str, Any]]) -> str:
    """The tutorial file a reader ends with, from the 01-start Python and diff blocks.

    Imports and module-level definitions are collected in page order; each statement of the
    `resnet_imagenet_trainer` body is kept once, at its first appearance (blocks repeat the
    previous code); `...` statements and diff blocks that remove lines (alternatives) are left out.

    Args:
        blocks: The page's blocks (extract_blocks).

    Returns:
        The Python source of tutorial.py.
    """
    imports, body, others, seen = [], [], [], set()
    for block in blocks:
        code, removes = block["code"], False
        if block["kind"] == "diff":
            code, removes = diff_new_text(code)
        if block["kind"] not in ("python", "diff") or removes or not _is_python(code):
            continue
        try:
            tree = ast.parse(_fix_elisions(code)[0])
        except SyntaxError:
            continue
        for node in tree.body:
            text = ast.unparse(node)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if text not in imports:
                    imports.append(text)
            elif isinstance(node, ast.FunctionDef) and node.name == "resnet_imagenet_trainer":
                for stmt in node.body:
                    stmt_text = ast.unparse(stmt)
                    is_ellipsis = isinstance(stmt, ast.Expr) and (
                        isinstance(stmt.value, ast.Constant) and stmt.value.value is ...
                    )
                    if not is_ellipsis and stmt_text not in seen and stmt_text not in TAKEN_BACK:
                        seen.add(stmt_text)
                        body.append(stmt)
            elif text not in others:
                others.append(text)
    # The return statement goes last (a later block's statements follow it in page order).
    body.sort(key=lambda s: isinstance(s, ast.Return))
    func = "def resnet_imagenet_trainer():\n" + textwrap.indent(
        "\n".join(ast.unparse(s) for s in body), "    "
    )
    return "\n".join(imports) + "\n\n\n" + func + "\n\n\n" + "\n\n\n".join(others) + "\n"


# The worker: runs one page's Python blocks in this process, prints one JSON line per block.
def _run_python_blocks(page: str, blocks: list[dict[str, Any]], redacted: set[str]) -> None:
    import importlib  # pylint: disable=import-outside-toplevel
    from unittest import mock  # pylint: disable=import-outside-toplevel

    shared = page == "02-concepts.md"
    namespace: dict[str, Any] = {}
    for block in blocks:
        code = block["code"]
        if block["kind"] == "diff":
            code, _ = diff_new_text(code)
        row = dict(page=page, block=block["index"], line=block["line"], kind=block["kind"])
        if not shared:
            namespace = {}
        namespace.setdefault("__name__", f"block_{block['index']}")
        status, error = "ran", None
        try:
            fixed, changed = _fix_elisions(code)
            tree = ast.parse(fixed)
            dropper = _DropEllipsisArgs()
            dropper.lines |= changed
            tree = ast.fix_missing_locations(dropper.visit(tree))
            stubs = _prepare_names(tree, namespace, importlib, mock, redacted)
            tainted, names = _tainted_lines(tree, stubs | set(namespace.get("__tainted__", ())))
            if shared:
                namespace["__tainted__"] = names
            try:
                exec(compile(tree, f"<{page} block {block['index']}>", "exec"), namespace)
                fn = namespace.get("resnet_imagenet_trainer")
                if fn is not None and not shared:
                    result = fn()
                    if result is not None:
                        row["built"] = type(result).__name__
            except Exception as e:  # pylint: disable=broad-except
                status, error = _classify(e, dropper.lines, tainted, redacted)
        except Exception as e:  # pylint: disable=broad-except
            status, error = "failed", _one_line(e)
        print(json.dumps(dict(row, status=status, ok=status != "failed", error=error)))
        sys.stdout.flush()


def _prepare_names(tree, namespace, importlib, mock, redacted) -> set[str]:
    """Imports AXLearn names the block uses but never imports; stubs the page's own names."""
    assigned = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    assigned |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assigned |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            args = node.args
            every = args.posonlyargs + args.args + args.kwonlyargs
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            assigned |= {a.arg for a in every}
        elif isinstance(node, ast.comprehension):
            assigned |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    stubs = set()
    builtins = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)
    for name in sorted(used - assigned - set(namespace) - set(builtins)):
        if name in AXLEARN_NAMES:
            module = importlib.import_module(AXLEARN_NAMES[name])
            namespace[name] = getattr(module, name)  # AttributeError: a name we lack (failed).
        elif name not in redacted:
            namespace[name] = mock.MagicMock(name=name)
            stubs.add(name)
    return stubs


def _tainted_lines(tree: ast.Module, stubs: set[str]) -> tuple[set[int], set[str]]:
    """Lines of the top-level statements that use a stub, or a name computed from one.

    Returns:
        (those lines, the stubs and the names computed from them).
    """
    tainted, lines = set(stubs), set()
    for stmt in tree.body:
        loads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        if not loads & tainted:
            continue
        lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                tainted.add(node.id)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
            ):
                tainted.add(node.func.value.id)  # e.g. `layers.append(stub(...))`.
    return lines, tainted


def _classify(e: BaseException, elided_lines: set[int], tainted: set[int], redacted: set[str]):
    tb = traceback.extract_tb(e.__traceback__)
    block_lines = [f.lineno for f in tb if f.filename.startswith("<") and "block" in f.filename]
    line = block_lines[-1] if block_lines else None
    message = _one_line(e)
    if isinstance(e, NameError) and getattr(e, "name", None) in redacted:
        return "placeholder", f"uses {e.name}, which the page builds in another block: {message}"
    if line is not None and line in elided_lines:
        return "placeholder", f"line {line} passes the page's `...`: {message}"
    if line is not None and line in tainted:
        return "placeholder", f"line {line} uses a name the page never defines: {message}"
    return "failed", message


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _redacted_names(tutorial: str) -> set[str]:
    body = _function_body(ast.parse(tutorial), "resnet_imagenet_trainer")
    names = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _worker_main(spec_path: str) -> None:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    if spec.get("devices"):
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={spec['devices']}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _run_python_blocks(spec["page"], spec["blocks"], set(spec["redacted"]))


def _run(cmd, *, cwd, env, timeout) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error", line)]
    return (errors or lines or [""])[-1][:300]


def _env(scratch: str, home: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOME=home,
        USER="reader",
        PYTHONPATH=os.pathsep.join([scratch, _REPO_ROOT, env.get("PYTHONPATH", "")]).strip(
            os.pathsep
        ),
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    return env


def _shell_row(page, index, block, *, scratch, env, preflight, timeout) -> dict[str, Any]:
    code = block["code"]
    if block["kind"] == "diff":
        code, _ = diff_new_text(code)
    row = dict(page=page, block=index, line=block["line"], kind=block["kind"])
    if "axlearn gcp launch" not in code:
        reason = "needs the network, gcloud or AXLearn's repository"
        return dict(row, status="not run", ok=True, error=None, reason=reason)
    extra = "--dry_run" + ("" if preflight else " --skip_preflight")
    script = re.sub(r"axlearn gcp launch start", f"axlearn gcp launch start {extra}", code)
    proc = _run(["bash", "-ec", script], cwd=scratch, env=env, timeout=timeout)
    ok = proc.returncode == 0 and "kind: JobSet" in proc.stdout
    if ok and "--output_dir" in code:
        ok = "# Output dir: gs://" in proc.stdout
    status = "ran" if ok else "failed"
    error = None if ok else _last_error(proc.stderr or proc.stdout)
    return dict(row, status=status, ok=ok, error=error, command=script.strip().splitlines()[-1])


def _tutorial_rows(tutorial: str, *, scratch, env, timeout, devices) -> list[dict[str, Any]]:
    del tutorial  # Written to <scratch>/tutorial.py by `check`.
    rows = []
    build = (
        "import tutorial\n"
        "cfg = tutorial.named_trainer_configs()['ResNet-50']()\n"
        "model = cfg.model.clone(name='model').instantiate(parent=None)\n"
        "from axlearn.common.utils import flatten_items\n"
        "import numpy as np\n"
        "specs = model.create_parameter_specs_recursively()\n"
        "n = sum(int(np.prod(s.shape)) for p, s in flatten_items(specs) if 'moving' not in p)\n"
        "print('PARAMS', n, cfg.name, cfg.max_step)\n"
    )
    proc = _run([sys.executable, "-c", build], cwd=scratch, env=env, timeout=timeout)
    match = re.search(r"PARAMS (\d+) (\S+) (\d+)", proc.stdout)
    row = dict(page="01-start.md", block="tutorial.py (assembled)", kind="build")
    if match:
        rows.append(dict(row, status="ran", ok=True, error=None, params=int(match.group(1))))
    else:
        rows.append(dict(row, status="failed", ok=False, error=_last_error(proc.stderr)))
    trainer_dir = os.path.join(os.path.dirname(scratch), "tutorial_run")
    shutil.rmtree(trainer_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "axlearn.common.launch_trainer_main", "--module=tutorial",
        "--config=ResNet-50", f"--trainer_dir={trainer_dir}", "--data_dir=FAKE",
        "--jax_backend=cpu",
    ] + [f"--config_override={o}" for o in TRAIN_OVERRIDES]  # fmt: skip
    train_env = dict(env, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = _run(cmd, cwd=scratch, env=train_env, timeout=timeout)
    losses = re.findall(r"step \d+/\d+.*?\| loss ([0-9.]+)", proc.stderr + proc.stdout)
    row = dict(page="01-start.md", block="tutorial.py (assembled)", kind="train")
    done = os.path.isdir(os.path.join(trainer_dir, "checkpoints", "step_00000002"))
    if proc.returncode == 0 and done and losses:
        rows.append(dict(row, status="ran", ok=True, error=None, losses=[float(x) for x in losses]))
    else:
        rows.append(dict(row, status="failed", ok=False, error=_last_error(proc.stderr)))
    return rows


def _setup_scratch(scratch: str) -> tuple[str, str]:
    home = os.path.join(scratch, "home")
    scratch = os.path.join(scratch, "project")
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, ".axlearn.config"), "w", encoding="utf-8") as f:
        f.write(GCP_CONFIG)
    for name, text in (
        ("Dockerfile", "FROM python:3.12\n"),
        ("pyproject.toml", '[project]\nname = "my_project"\nversion = "0.0.1"\n'),
    ):
        with open(os.path.join(scratch, name), "w", encoding="utf-8") as f:
            f.write(text)
    if not os.path.isdir(os.path.join(scratch, ".git")):
        _git(scratch, "init", "-q")
    _git(scratch, "add", "Dockerfile", "pyproject.toml")
    _git(scratch, "commit", "-qm", "project", "--allow-empty")
    return scratch, home


def _git(cwd: str, *args: str) -> None:
    git = ["git", "-c", "user.name=reader", "-c", "user.email=reader@example.com"]
    subprocess.run(git + list(args), cwd=cwd, check=True, capture_output=True)


def check(
    docs_dir: str, *, scratch: str, preflight: bool = False, timeout: int = 1200, devices: int = 8
) -> list[dict[str, Any]]:
    """Runs every block of the pages; returns the rows of the table.

    Args:
        docs_dir: The folder with 01-start.md and 02-concepts.md.
        scratch: A scratch folder outside the repository.
        preflight: Whether the launch examples compile their trainer (slow).
        timeout: Seconds per subprocess.
        devices: CPU devices of the tutorial's training run.

    Returns:
        One dict per block (see the module docstring).
    """
    scratch, home = _setup_scratch(os.path.abspath(scratch))
    env = _env(scratch, home)
    rows: list[dict[str, Any]] = []
    pages = {}
    for page in PAGES:
        with open(os.path.join(docs_dir, page), encoding="utf-8") as f:
            pages[page] = extract_blocks(f.read())
    tutorial = assemble_tutorial(pages["01-start.md"])
    redacted = _redacted_names(tutorial)
    # The reader's own experiment module (the launch example with --module=tutorial uses it),
    # committed: the launch bundles a clean git tree.
    with open(os.path.join(scratch, "tutorial.py"), "w", encoding="utf-8") as f:
        f.write(tutorial)
    _git(scratch, "add", "tutorial.py")
    _git(scratch, "commit", "-qm", "tutorial", "--allow-empty")
    for page, blocks in pages.items():
        python_blocks = []
        for index, block in enumerate(blocks, start=1):
            block["index"] = index
            code = diff_new_text(block["code"])[0] if block["kind"] == "diff" else block["code"]
            if block["kind"] == "python" or (block["kind"] == "diff" and _is_python(code)):
                python_blocks.append(block)
            elif block["kind"] in ("shell", "bash", "diff"):
                rows.append(
                    _shell_row(
                        page,
                        index,
                        block,
                        scratch=scratch,
                        env=env,
                        preflight=preflight,
                        timeout=timeout,
                    )
                )
        spec_path = os.path.join(os.path.dirname(scratch), f"blocks_{page}.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(dict(page=page, blocks=python_blocks, redacted=sorted(redacted)), f)
        proc = _run(
            [sys.executable, os.path.abspath(__file__), "--worker", spec_path],
            cwd=scratch,
            env=env,
            timeout=timeout,
        )
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        rows.extend(got)
        if len(got) < len(python_blocks):
            rows.append(
                dict(page=page, block="worker", status="failed", ok=False,
                     error=_last_error(proc.stderr))
            )  # fmt: skip
    rows.extend(
        _tutorial_rows(tutorial, scratch=scratch, env=env, timeout=timeout, devices=devices)
    )
    order = {p: i for i, p in enumerate(PAGES)}
    rows.sort(
        key=lambda r: (
            order.get(r["page"], 9),
            isinstance(r["block"], str),
            str(r["block"]).zfill(4),
        )
    )
    return rows


def _default_docs_dir() -> str:
    """../shared/reference/axlearn_docs beside the repository (or beside its main worktree)."""
    relative = os.path.join("..", "shared", "reference", "axlearn_docs")
    candidate = os.path.normpath(os.path.join(_REPO_ROOT, relative))
    if not os.path.isdir(candidate):
        proc = subprocess.run(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
            cwd=_REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            common_root = os.path.dirname(proc.stdout.strip())
            candidate = os.path.normpath(os.path.join(common_root, relative))
    return candidate


def main(argv: Optional[list[str]] = None) -> int:
    """Parses flags, runs the pages and prints the JSON table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "docs_dir",
        nargs="?",
        default=_default_docs_dir(),
        help="Folder with AXLearn's 01-start.md and 02-concepts.md "
        "(default: ../shared/reference/axlearn_docs next to the repository).",
    )
    parser.add_argument(
        "--scratch",
        default=os.path.join(tempfile.gettempdir(), "axlearn_docs_check"),
        help="Scratch folder outside the repository.",
    )
    parser.add_argument(
        "--preflight", action="store_true", help="Let the launch examples compile (slow)."
    )
    parser.add_argument("--timeout", type=int, default=1200, help="Seconds per subprocess.")
    parser.add_argument("--devices", type=int, default=8, help="CPU devices of the training run.")
    parser.add_argument("--output", default="", help="Also write the JSON here.")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker)
        return 0
    for page in PAGES:
        if not os.path.isfile(os.path.join(args.docs_dir, page)):
            parser.error(f"{page} not found in {args.docs_dir!r}: pass the folder holding it")
    rows = check(
        args.docs_dir,
        scratch=args.scratch,
        preflight=args.preflight,
        timeout=args.timeout,
        devices=args.devices,
    )
    text = json.dumps(rows, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
