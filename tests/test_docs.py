"""The docs are tested: every ```python block of every docs/**/*.md page runs as a test.

Each block runs on its own, in a fresh namespace whose `__name__` is "__main__" (as if pasted into
a script), so a broken example fails a test named after its page and line, e.g. `config.md:42`.
A block fenced as ```python notest is shown to readers but not run (use it for commands that
need a cluster, a data set or minutes of compute).

Shell blocks (```sh, ```bash, ```shell) run too, in the slow suite
(`test_shell_blocks_run_on_cpu`): every one not marked `notest` (those that need a cluster, a
TPU or a GPU, a GCP config, or tens of minutes), page by page in the order docs/index.md lists
the pages, each page's blocks in one bash session in a fresh temporary directory that stands in
for `/tmp/`; a block fails on a non-zero exit, a traceback or an E-line (absl/glog `E0000 ...`).
In a block of `$ command` lines, only those lines run (the others are its output).

Also checked: every page is linked from docs/index.md, relative links between pages resolve,
and no two commands of the docs train one trainer dir with different inputs or experiments (a
reader running the pages in turn would resume one run's checkpoint with another's input).
"""

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

DOCS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")

# An opening or closing fence: up to 3 spaces of indentation (more inside list items is allowed
# too), then ``` or ~~~ (3 or more), then an optional info string.
_FENCE_RE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass
class DocBlock:
    """A fenced code block of a docs page."""

    # Path relative to docs/, e.g. "config.md".
    page: str
    # 1-based line number of the opening fence.
    line: int
    # The info string words after the fence, e.g. ["python", "notest"].
    info: list[str]
    # The block's code, dedented by the fence's indentation.
    source: str
    # 1-based line number of the closing fence.
    end_line: int = 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[str]:
    """Returns the paths (relative to docs/) of every markdown page, sorted."""
    pages = []
    for dirpath, _, filenames in os.walk(DOCS_DIR):
        for filename in filenames:
            if filename.endswith(".md"):
                pages.append(os.path.relpath(os.path.join(dirpath, filename), DOCS_DIR))
    return sorted(pages)


def parse_blocks(page: str, text: str) -> list[DocBlock]:
    """Returns the fenced code blocks of a markdown page, in order.

    Args:
        page: The page's path, for ids and error messages.
        text: The page's markdown.

    Returns:
        The blocks.

    Raises:
        ValueError: If a fence is never closed.
    """
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE_RE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match.group("indent"), match.group("fence")
        start = i
        body = []
        i += 1
        while i < len(lines):
            close = _FENCE_RE.match(lines[i])
            if (
                close
                and close.group("fence")[0] == fence[0]
                and len(close.group("fence")) >= len(fence)
                and not close.group("info").strip()
            ):
                break
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        else:
            raise ValueError(f"{page}:{start + 1}: code block fence {fence} is never closed")
        blocks.append(
            DocBlock(
                page=page,
                line=start + 1,
                info=match.group("info").split(),
                source="\n".join(body) + "\n",
                end_line=i + 1,
            )
        )
        i += 1
    return blocks


def _read(page: str) -> str:
    with open(os.path.join(DOCS_DIR, page), encoding="utf-8") as f:
        return f.read()


def python_blocks() -> list[DocBlock]:
    """Returns every ```python block of the docs that is not marked `notest`."""
    blocks = []
    for page in doc_pages():
        for block in parse_blocks(page, _read(page)):
            if block.info[:1] == ["python"] and "notest" not in block.info[1:]:
                blocks.append(block)
    return blocks


_BLOCKS = python_blocks()


@pytest.mark.parametrize("block", _BLOCKS, ids=[b.id for b in _BLOCKS])
def test_doc_example(block: DocBlock):
    namespace = {"__name__": "__main__", "__file__": os.path.join(DOCS_DIR, block.page)}
    # Compiled with the page and line as its file name, so tracebacks point into the docs.
    code = compile(block.source, f"docs/{block.page}:{block.line}", "exec")
    exec(code, namespace)  # pylint: disable=exec-used


def test_docs_have_examples():
    # Guards against a parser change (or a renamed folder) that silently runs no example.
    assert "config.md" in doc_pages()
    assert sum(b.page == "config.md" for b in _BLOCKS) >= 5


# [text](target) links (and images): the target must resolve.
_LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _local_links(page: str) -> list[str]:
    text = _read(page)
    # Links inside code blocks are examples, not links: drop those lines.
    lines = text.splitlines()
    for block in parse_blocks(page, text):
        for n in range(block.line - 1, block.end_line):
            lines[n] = ""
    # Inline code spans are not links either.
    text = re.sub(r"`[^`\n]*`", "", "\n".join(lines))
    targets = []
    for target in _LINK_RE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, mailto:, in-page anchors.
        targets.append(target.split("#", 1)[0])
    return targets


def test_index_links_every_page():
    linked = {os.path.normpath(t) for t in _local_links("index.md")}
    unlinked = [p for p in doc_pages() if p != "index.md" and p not in linked]
    assert not unlinked, f"docs/index.md does not link: {unlinked}"


@pytest.mark.parametrize("page", doc_pages())
def test_relative_links_resolve(page: str):
    base = os.path.dirname(os.path.join(DOCS_DIR, page))
    broken = [t for t in _local_links(page) if not os.path.exists(os.path.join(base, t))]
    assert not broken, f"docs/{page} links to missing files: {broken}"


def test_parse_blocks():
    text = (
        "# Title\n"
        "```python\n"
        "x = 1\n"
        "```\n"
        "- item\n"
        "    ```python notest\n"
        "    y = 2\n"
        "    ```\n"
        "~~~text\n"
        "```python\n"
        "~~~\n"
    )
    blocks = parse_blocks("t.md", text)
    assert [(b.id, b.info, b.source) for b in blocks] == [
        ("t.md:2", ["python"], "x = 1\n"),
        ("t.md:6", ["python", "notest"], "y = 2\n"),
        ("t.md:9", ["text"], "```python\n"),
    ]
    with pytest.raises(ValueError, match="t.md:1: code block fence ``` is never closed"):
        parse_blocks("t.md", "```python\nx = 1\n")


_SHELL_INFOS = ("sh", "bash", "shell", "console")
# Commands that write a trainer dir (train into it or create it).
_WRITERS = ("launch_trainer_main", "axlearn hf import")


def _shell_commands(source: str) -> list[str]:
    """The logical command lines of a shell block: continuations joined, `$ ` prompts dropped."""
    text = re.sub(r"\\\n\s*", " ", source)
    return [line.strip().removeprefix("$ ") for line in text.splitlines() if line.strip()]


def _flag(command: str, name: str) -> "str | None":
    match = re.search(rf"--{name}=(\S+)", command)
    return match.group(1) if match else None


def trainer_dir_writers(pages: dict[str, str]) -> dict[str, list[tuple[str, tuple]]]:
    """Every documented command that writes a local trainer dir, by dir.

    Args:
        pages: {page: markdown}.

    Returns:
        {trainer_dir: [(where, (module, config, data_dir)), ...]} in page order; `where` is
        "page:line"; data_dir is "default" without the flag.
    """
    writers: dict[str, list[tuple[str, tuple]]] = {}
    for page, text in pages.items():
        for block in parse_blocks(page, text):
            if block.info[:1] and block.info[0] not in _SHELL_INFOS:
                continue
            for command in _shell_commands(block.source):
                if not any(w in command for w in _WRITERS):
                    continue
                trainer_dir = _flag(command, "trainer_dir")
                if not trainer_dir or "://" in trainer_dir or "$" in trainer_dir:
                    continue
                fields = ("module", "config", "data_dir")
                key = tuple(_flag(command, f) or "default" for f in fields)
                writers.setdefault(trainer_dir, []).append((block.id, key))
    return writers


def trainer_dir_collisions(pages: dict[str, str]) -> list[str]:
    """One line per trainer dir that two documented commands write with different inputs.

    Args:
        pages: {page: markdown}.

    Returns:
        The lines, e.g. "/tmp/x: a.md:3 (text.gpt.tiny, gpt-tiny, FAKE) vs b.md:9 (..., default)".
    """
    lines = []
    for trainer_dir, uses in sorted(trainer_dir_writers(pages).items()):
        first_where, first = uses[0]
        for where, key in uses[1:]:
            if key != first:
                lines.append(
                    f"{trainer_dir}: {first_where} (module, config, data_dir = {first}) vs "
                    f"{where} ({key}): give one of them its own --trainer_dir"
                )
    return lines


def test_no_two_pages_train_one_trainer_dir_with_different_inputs():
    """Issue 55 case 1: e.g. trainer.md trains /tmp/gpt-tiny-2p with --data_dir=FAKE, so no
    page may resume it with the real input."""
    pages = {page: _read(page) for page in doc_pages()}
    writers = trainer_dir_writers(pages)
    assert "/tmp/gpt-tiny" in writers and "/tmp/gpt-tiny-2p" in writers  # The check sees them.
    assert trainer_dir_collisions(pages) == []


def test_trainer_dir_collision_check_finds_one():
    pages = {
        "a.md": "```sh\npython -m axlearn.common.launch_trainer_main --module=m --config=c \\\n"
        "    --trainer_dir=/tmp/x --data_dir=FAKE\n```\n",
        "b.md": "```sh\naxlearn local launch -- python -m axlearn.common.launch_trainer_main "
        "--module=m --config=c --trainer_dir=/tmp/x\n```\n",
    }
    assert trainer_dir_collisions(pages) == [
        "/tmp/x: a.md:1 (module, config, data_dir = ('m', 'c', 'FAKE')) vs b.md:1 "
        "(('m', 'c', 'default')): give one of them its own --trainer_dir"
    ]


def _doc_imports() -> list[tuple[str, str, str]]:
    """(block id, module, name) of every `from M import N` in a python block, notest ones too."""
    import ast  # pylint: disable=import-outside-toplevel

    found = []
    for page in doc_pages():
        for block in parse_blocks(page, _read(page)):
            if block.info[:1] != ["python"]:
                continue
            try:
                tree = ast.parse(block.source)
            except SyntaxError:
                continue  # Elided code (`...` in odd places); the runnable blocks are run.
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    if node.module.split(".")[0] == "axlearn":
                        found.extend((block.id, node.module, a.name) for a in node.names)
    return found


def test_every_axlearn_import_of_the_docs_resolves():
    """Issue 55 case 7: pipeline.md's (notest) block imported ChainConfigModifier from
    axlearn.common.config, where it is not; notest blocks are not run, so check their imports."""
    import importlib  # pylint: disable=import-outside-toplevel

    imports = _doc_imports()
    assert len(imports) > 50
    missing = []
    for where, module, name in imports:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{where}: {module}: {e}")
            continue
        if name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: from {module} import {name}")
    assert missing == []


# absl/glog error and fatal lines: `E1202 03:04:05.678 ...`, `E0000 00:00:1796...`, with the
# `[i] ` prefix of `axlearn local launch`.
_E_LINE_RE = re.compile(r"^(\[\d+\] )?[EF]\d{4} \d\d:\d\d:\d\d", re.M)
_BLOCK_MARK = "@@axlearn-docs-block"


def shell_blocks(pages: Sequence[str]) -> list[DocBlock]:
    """The runnable shell blocks of `pages`, in order (not `notest`)."""
    blocks = []
    for page in pages:
        for block in parse_blocks(page, _read(page)):
            if block.info[:1] and block.info[0] in _SHELL_INFOS and "notest" not in block.info:
                blocks.append(block)
    return blocks


def pages_in_reading_order() -> list[str]:
    """docs/index.md's pages in the order it links them, then any others (sorted)."""
    linked = []
    for target in _local_links("index.md"):
        page = os.path.normpath(target)
        if page.endswith(".md") and page in doc_pages() and page not in linked:
            linked.append(page)
    return ["index.md", *linked, *[p for p in doc_pages() if p not in linked and p != "index.md"]]


def shell_script(blocks: Sequence[DocBlock], *, scratch: str) -> str:
    """One bash script running `blocks` in order, each announced by a marker line.

    `/tmp/` in a command becomes `scratch/`; a `$ ` block runs only its `$ ` lines.

    Args:
        blocks: The blocks of one page.
        scratch: The directory that stands in for /tmp.

    Returns:
        The script (`set -e`: it stops at the first failing command).
    """
    lines = ["set -e"]
    for block in blocks:
        source = block.source
        if any(line.startswith("$ ") for line in source.splitlines()):
            source = "\n".join(_prompt_commands(source))
        lines.append(f"echo '{_BLOCK_MARK} {block.id}'")
        lines.append(source.replace("/tmp/", scratch.rstrip("/") + "/").rstrip("\n"))
    return "\n".join(lines) + "\n"


def _prompt_commands(source: str) -> list[str]:
    """The `$ ` commands of a block showing commands and their output; a command whose shown
    output is an error (`...: error: ...`) is expected to fail (`|| true`), and still checked
    for tracebacks and E-lines."""
    commands: list[list] = []
    for line in source.splitlines():
        if line.startswith("$ "):
            commands.append([line[2:], False])
        elif commands and ": error: " in line:
            commands[-1][1] = True
    return [f"{cmd} || true" if fails else cmd for cmd, fails in commands]


def block_problems(output: str, returncode: int) -> dict[str, str]:
    """What went wrong in each block of a page's run, from its combined output.

    Args:
        output: stdout and stderr of `shell_script`, interleaved.
        returncode: The script's exit status.

    Returns:
        {block id: problem} for each block with a traceback or an E-line, and for the block
        that failed (the last one started) when the status is not 0.
    """
    problems: dict[str, str] = {}
    parts = output.split(f"{_BLOCK_MARK} ")
    started = []
    for part in parts[1:]:
        block_id, _, text = part.partition("\n")
        started.append(block_id)
        found = []
        if "Traceback (most recent call last)" in text:
            found.append("a traceback")
        match = _E_LINE_RE.search(text)
        if match:
            found.append("an E-line: " + text[match.start() :].split("\n", 1)[0][:300])
        if found:
            problems[block_id] = "; ".join(found)
    if returncode != 0:
        last = started[-1] if started else "(before the first block)"
        tail = output.strip().splitlines()[-1:] or [""]
        problems[last] = (problems.get(last, "") + f"; exit status {returncode}: {tail[0][:300]}")
        problems[last] = problems[last].lstrip("; ")
    return problems


def _run_page(blocks: Sequence[DocBlock], scratch: str, *, timeout: float) -> dict[str, str]:
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    repo = os.path.dirname(DOCS_DIR)
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for name in ("JAX_PLATFORMS", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL"):
        env.pop(name, None)  # As a user's shell has them.
    proc = subprocess.run(
        ["bash", "-c", shell_script(blocks, scratch=scratch)],
        cwd=scratch,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return block_problems(proc.stdout, proc.returncode)


@pytest.mark.slow
# Every page's commands in turn: several 300-step runs (about 30 min on 2 busy cores).
@pytest.mark.timeout(3000)
def test_shell_blocks_run_on_cpu(tmp_path):
    """Issue 55 case 8: a new user runs the pages' commands in turn; none fails, prints a
    traceback or an E-line. AXLEARN_DOCS_PAGES=a.md,b.md limits the run to those pages."""
    pages = pages_in_reading_order()
    only = os.environ.get("AXLEARN_DOCS_PAGES")
    if only:
        pages = [p for p in pages if p in only.split(",")]
    scratch = str(tmp_path)
    problems = {}
    ran = 0
    for page in pages:
        blocks = [b for b in shell_blocks([page])]
        if blocks:
            ran += len(blocks)
            problems.update(_run_page(blocks, scratch, timeout=3600))
    assert ran > 0
    assert problems == {}


def test_shell_block_runner_reports_failures_tracebacks_and_e_lines(tmp_path):
    pages = {
        "a.md": (
            "```sh\necho ok > /tmp/x.txt\ncat /tmp/x.txt\n```\n"
            "```sh notest\nexit 3\n```\n"
            "```shell\n$ A=7\noutput line\n$ echo $A >&2\n$ false\nx: error: shown\n```\n"
            "```sh\necho 'E0000 00:00:1796181679.670844 1 x.cc:1] bad'\n```\n"
            "```bash\npython -c 'raise ValueError(1)'\necho never\n```\n"
            "```sh\necho not reached\n```\n"
        ),
    }
    blocks = [
        b
        for b in parse_blocks("a.md", pages["a.md"])
        if b.info[0] in _SHELL_INFOS and "notest" not in b.info
    ]
    assert [b.id for b in blocks] == ["a.md:1", "a.md:8", "a.md:15", "a.md:18", "a.md:22"]
    script = shell_script(blocks, scratch=str(tmp_path))
    assert f"echo ok > {tmp_path}/x.txt" in script and "output line" not in script
    assert "\nfalse || true\n" in script  # Its shown output is an error.
    problems = _run_page(blocks, str(tmp_path), timeout=60)
    assert (tmp_path / "x.txt").read_text() == "ok\n"
    assert set(problems) == {"a.md:15", "a.md:18"}, problems
    assert problems["a.md:15"].startswith("an E-line: E0000 00:00:1796181679.670844")
    assert problems["a.md:18"].startswith("a traceback; exit status 1: ValueError: 1")
