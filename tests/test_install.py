"""The installed package: the wheel, and every command after README command 1 alone.

`base_env` (tests/base_install.py) builds the wheel from this repository and a fresh venv that
holds it and the base dependencies only: every package of an extra ([dev], [gcp], [tpu],
[wandb]: torch, transformers, libtpu, kubernetes, wandb, ...) is absent from it, exactly as
after `pip install .` without extras. Commands run with that venv's python, from `/` unless they
need the repository (the trained test run's experiment module lives in tests/).
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile

import pytest

from tests.base_install import REPO_ROOT, BaseEnv, make_base_env
from tests.trained_run import LLAMA_OVERRIDES, MODULE

pytestmark = pytest.mark.slow

# A `--module=M` (optionally followed by `--config=C`) in the docs or the README; not a
# placeholder such as `--module=text.gpt.<name>`.
_MODULE_RE = re.compile(
    r"--module[= ](?P<module>(?:axlearn\.experiments\.|text\.)[\w.]+)(?![\w.<])"
    r"(?:[ \\\n]+--config[= ](?P<config>[\w.-]+))?"
)
# The one line of a command that needs an extra.
_EXTRA_RE = re.compile(r"pip install 'axlearn\[(?P<extra>\w+)\]'")
# The gcp config file of the docs' examples (docs/launch.md).
GCP_CONFIG = """
[gcp."my-project:us-east5-a"]
project = "my-project"
zone = "us-east5-a"
permanent_bucket = "my-permanent"
docker_repo = "us-docker.pkg.dev/my-project/axlearn"
labels = "v5p"
"""


@pytest.fixture(scope="module")
def base_env(tmp_path_factory) -> BaseEnv:
    return make_base_env(str(tmp_path_factory.mktemp("base_install")))


def documented_modules() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """The `--module` values of the commands in docs/*.md and README.md.

    Returns:
        ({module: the `--config` values documented with it}, {(module, config): the error line
        shown under it, up to any "..."} for `axlearn config` examples that document an error).
    """
    pages = [os.path.join(REPO_ROOT, "README.md")]
    docs = os.path.join(REPO_ROOT, "docs")
    pages += [os.path.join(docs, f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]
    found: dict[str, set[str]] = {}
    errors: dict[tuple[str, str], str] = {}
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        # Commands only: fenced blocks, and inline code that starts with a command (prose such
        # as "`--module=text.gpt.fuji --config=fuji-7B-v3` is now ..." is not an example).
        snippets = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
        snippets += re.findall(r"`((?:axlearn|python) [^`]+)`", text)
        for match in (m for snippet in snippets for m in _MODULE_RE.finditer(snippet)):
            rest = match.string[match.end() :]
            configs = found.setdefault(match["module"], set())
            if not match["config"]:
                continue
            next_line = rest.split("\n", 2)[1] if "\n" in rest else ""
            if next_line.startswith("axlearn config: error: "):  # A documented config error.
                errors[(match["module"], match["config"])] = next_line.split("...", 1)[0]
            else:
                configs.add(match["config"])
    return found, errors


def _output(proc) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_wheel_holds_only_axlearn(base_env):
    with zipfile.ZipFile(base_env.wheel) as z:
        names = z.namelist()
        (top_level_txt,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        top_level = z.read(top_level_txt).decode().split()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"axlearn"}
    assert top_level == ["axlearn"]
    # The named experiments and the shipped data are in it; the golden dumps are not.
    assert "axlearn/experiments/text/gpt/tiny.py" in names
    assert "axlearn/data/python_docs/corpus.jsonl.gz" in names
    assert not [n for n in names if "testdata" in n or n.startswith("experiments/")]


def test_experiments_is_not_importable_from_the_wheel(base_env):
    proc = base_env.run(["-c", "import experiments"])
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'experiments'" in proc.stderr
    proc = base_env.run(["-c", "import axlearn, torch"])
    assert "No module named 'torch'" in proc.stderr, "the base env has an extra's package"
    proc = base_env.run(["-c", "import axlearn; print(axlearn.__file__)"])
    assert proc.stdout.startswith(os.path.dirname(os.path.dirname(base_env.python)))


def test_every_documented_module_works_from_root(base_env):
    documented, errors = documented_modules()
    assert {"text.gpt.tiny", "text.gpt.honeycrisp", "text.gpt.fuji"} <= set(documented)
    for module, configs in sorted(documented.items()):
        proc = base_env.run(["-m", "axlearn.cli.main", "config", "list", f"--module={module}"])
        assert proc.returncode == 0, f"config list --module={module}\n{_output(proc)}"
        listed = set(proc.stdout.split())
        assert configs <= listed, (module, configs - listed)
        for config in sorted(configs):
            args = ["config", "dump", f"--module={module}", f"--config={config}"]
            proc = base_env.run(["-m", "axlearn.cli.main", *args])
            assert proc.returncode == 0, f"{' '.join(args)}\n{_output(proc)}"
            lines = proc.stdout.splitlines()
            assert len(lines) > 20 and all(": " in line for line in lines), args
    # Examples that document an error print that error.
    for (module, config), error in sorted(errors.items()):
        args = ["config", "dump", f"--module={module}", f"--config={config}"]
        proc = base_env.run(["-m", "axlearn.cli.main", *args])
        assert proc.returncode != 0 and proc.stderr.startswith(error), _output(proc)


def _check(base_env: BaseEnv, args: list[str], expect: str, **kwargs):
    """Runs `axlearn ARGS`; `expect` is "works" or the name of the extra it must name."""
    proc = base_env.run(["-m", "axlearn.cli.main", *args], **kwargs)
    what = f"axlearn {' '.join(args)}\n{_output(proc)}"
    assert "Traceback" not in proc.stderr, what
    if expect == "works":
        assert proc.returncode == 0, what
        return proc
    assert proc.returncode != 0, what
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, what
    match = _EXTRA_RE.search(lines[0])
    assert match and match["extra"] == expect, what
    return proc


def test_every_command_works_or_names_its_extra(base_env, trained_dir, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".axlearn.config").write_text(GCP_CONFIG)
    env = {
        "HOME": str(home),
        "JAX_PLATFORMS": "cpu",
        "PATH": os.path.dirname(base_env.python) + os.pathsep + os.environ["PATH"],
    }
    # The trained run's experiment module is in tests/: those commands run from the repo.
    repo = dict(env=env, cwd=REPO_ROOT)
    root = dict(env=env, cwd="/")
    ckpt = os.path.join(trained_dir, "checkpoints")
    hf_dir, ft_dir, charts = (str(tmp_path / d) for d in ("hf", "ft", "charts"))

    assert _check(base_env, ["--version"], "works", **root).stdout.strip()
    # docs/config.md, docs/compare.md.
    dump = tmp_path / "now.txt"
    args = ["config", "dump", "--module=text.gpt.tiny", "--config=gpt-tiny"]
    dump.write_text(_check(base_env, args, "works", **root).stdout)
    golden = os.path.join(REPO_ROOT, "experiments/testdata/axlearn.experiments.text.gpt.tiny")
    _check(base_env, ["config", "diff", f"{golden}/gpt-tiny.txt", str(dump)], "works", **root)
    # docs/reliability.md, docs/checkpoints.md.
    assert "6" in _check(base_env, ["checkpoint", "list", ckpt], "works", **root).stdout
    _check(base_env, ["checkpoint", "verify", ckpt], "works", **root)
    copy = str(tmp_path / "checkpoints")  # `select` renames newer steps: work on a copy.
    shutil.copytree(ckpt, copy)
    _check(base_env, ["checkpoint", "select", copy, "--step", "6"], "works", **root)
    # docs/inference.md.
    # The run's module is the tests' own: named with --module (a module named only by the run's
    # files is never imported).
    _check(
        base_env, ["eval", f"--trainer_dir={trained_dir}", f"--module={MODULE}"], "works", **repo
    )
    args = ["generate", f"--trainer_dir={trained_dir}", f"--module={MODULE}", "--prompt=The Python"]
    _check(base_env, [*args, "--max_new_tokens=4", "--seed=0"], "works", **repo)
    args = ["hf", "export", f"--trainer_dir={trained_dir}", f"--module={MODULE}"]
    _check(base_env, [*args, f"--output={hf_dir}"], "works", **repo)
    assert any(f.endswith(".safetensors") for f in os.listdir(hf_dir))
    args = ["hf", "import", hf_dir, f"--module={MODULE}", "--config=gpt-tiny-eval"]
    _check(base_env, [*args, f"--trainer_dir={ft_dir}", *LLAMA_OVERRIDES], "works", **repo)
    # docs/compare.md.
    _check(base_env, ["compare", trained_dir, trained_dir, f"--plot={charts}"], "works", **root)
    assert any(f.endswith(".png") for f in os.listdir(charts))
    # docs/aot.md: needs libtpu.
    args = ["aot", "--module=text.gpt.honeycrisp", "--config=honeycrisp-3B"]
    _check(base_env, [*args, "--topology=v5litepod-256"], "tpu", **root)
    # docs/launch.md. The dry run builds from the repo's Dockerfile (allow_dirty: the test's
    # checkout may have uncommitted changes); its pre-flight compile needs libtpu.
    _check(base_env, ["gcp", "config", "activate", "--label=v5p"], "works", **root)
    assert "my-project" in _check(base_env, ["gcp", "config", "list"], "works", **root).stdout
    launch = ["gcp", "launch", "--dry_run", "--bundler_spec=allow_dirty=true"]
    job = ["--", "python", "-m", "axlearn.common.launch_trainer_main"]
    job += ["--module=text.gpt.tiny", "--config=gpt-tiny"]
    dry_run = [*launch, "--instance_type=tpu-v5p-8", "--name=x", *job]
    _check(base_env, dry_run, "tpu", **repo)
    _check(base_env, ["gcp", "launch", "list"], "gcp", **root)
    _check(base_env, ["gcp", "launch", "stop", "--name=honeycrisp-3b"], "gcp", **root)
    # docs/launch.md runs the trainer this way (tested in tests/cli/test_local.py); here a short
    # command shows that the launcher itself needs no extra.
    local = ["local", "launch", "--num_processes=2", "--", "python", "-c", "import axlearn"]
    _check(base_env, local, "works", **root)
