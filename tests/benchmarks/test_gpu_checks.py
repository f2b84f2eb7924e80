"""benchmarks/gpu_checks.sh's shell logic, with a stand-in `python3` that prints its arguments:
the parts' order, their time limits cut to the deadline, `@BUDGET@`, `GPU_CHECKS_TINY`, and what
comes back (at most 8 files)."""

import json
import os
import subprocess
import sys

from tests.benchmarks.no_tensorflow import REPO_ROOT

# A `python3` that prints {"argv": [...]} for the benchmarks and runs the summary for real.
FAKE_PYTHON = f"""#!/bin/bash
if [ "$1" = benchmarks/gpu_checks_summary.py ]; then exec {sys.executable} "$@"; fi
printf '%s\\n' "$@" | {sys.executable} -c 'import json, sys; \
print(json.dumps(dict(argv=sys.stdin.read().split())))'
echo "log of $2" >&2
"""


def _run_checks(tmp_path, out_name: str = "out", **env) -> tuple[str, dict]:
    """Runs the script with the stand-in python3; returns its stdout and each part's argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / out_name
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out), **env)
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_checks.sh"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    argv = {}
    for name in ("save50", "sweep", "save5", "trace"):
        path = out / f"{name}.json"
        if path.exists() and path.read_text():
            argv[name] = json.loads(path.read_text())["argv"]
    return proc.stdout, argv


def test_parts_order_limits_and_tiny(tmp_path):
    stdout, argv = _run_checks(tmp_path, GPU_CHECKS_TINY="1")
    lines = stdout.splitlines()
    # Most important first; each part's limit as written (the deadline is far).
    assert [line.split(" at ")[0] for line in lines[:4]] == [
        "save50: exit 0",
        "sweep: exit 0",
        "save5: exit 0",
        "trace: exit 0",
    ]
    assert [line.rsplit(" ", 1)[1] for line in lines[:4]] == [
        "190s)",
        "330s)",
        "110s)",
        "170s)",
    ]
    assert argv["save50"] == ["benchmarks/honeycrisp_1b.py", "--tiny", "--steps", "105"] + [
        "--save_every",
        "50",
    ]
    sweep = argv["sweep"]
    assert sweep[:2] == ["benchmarks/gpu_sweep.py", "--tiny"] and "--fp8" in sweep
    assert sweep[sweep.index("--budget_s") + 1] == str(330 - 15)
    assert sweep[sweep.index("--chunks") + 1] == "16"  # The tiny model's 64-token sequence.
    assert argv["trace"][argv["trace"].index("--budget_s") + 1] == str(170 - 15)
    assert "--fp8" not in argv["trace"]
    # The summary's headline lines follow (the stand-in JSONs have no numbers).
    assert lines[4:6] == ["save50: None: step n/a s, MFU n/a", "save50: no checkpoint section"]
    # What comes back: 4 JSONs, the summary and the logs as one archive.
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == sorted(
        ["save50.json", "sweep.json", "save5.json", "trace.json", "logs.tgz", "summary.txt"]
    )
    listing = subprocess.run(
        ["tar", "tzf", str(tmp_path / "out" / "logs.tgz")], capture_output=True, text=True
    ).stdout.split()
    assert sorted(listing) == ["./save5.err", "./save50.err", "./sweep.err", "./trace.err"]


def test_deadline_cuts_and_skips(tmp_path):
    stdout, argv = _run_checks(tmp_path, DEADLINE="200")
    # The sweep's 330 s are cut to what is left of 200 s; its budget follows; no --tiny on a GPU.
    sweep_line = stdout.splitlines()[1]
    limit = int(sweep_line.split("(limit ")[1].rstrip("s)"))
    assert sweep_line.startswith("sweep: exit 0 at ") and 190 <= limit <= 200, sweep_line
    sweep = argv["sweep"]
    assert "--tiny" not in sweep and sweep[sweep.index("--chunks") + 1] == "1024"
    assert sweep[sweep.index("--budget_s") + 1] == str(limit - 15)
    # No time at all: every part is skipped and says so; a rerun starts a new summary.
    (tmp_path / "out").joinpath("summary.txt").write_text("an earlier run\n")
    stdout, argv = _run_checks(tmp_path, DEADLINE="5")
    assert stdout.splitlines()[:4] == [
        "save50: skipped (no time left)",
        "sweep: skipped (no time left)",
        "save5: skipped (no time left)",
        "trace: skipped (no time left)",
    ]
    assert "an earlier run" not in stdout
