"""Tests axlearn/cli/config_commands.py: `config diff` and module-less `config list`."""

import pathlib

import pytest

from axlearn.cli.main import main

TINY = ["--module=text.gpt.tiny", "--config=gpt-tiny"]
HONEYCRISP = ["--module=text.gpt.honeycrisp", "--config=honeycrisp-3B"]


def test_diff_tiny_vs_honeycrisp(capsys):
    rc = main(["config", "diff", *TINY, *HONEYCRISP])
    out = capsys.readouterr().out
    assert rc == 1
    assert out.startswith("--- text.gpt.tiny:gpt-tiny\n+++ text.gpt.honeycrisp:honeycrisp-3B\n")
    # Values that really differ between the two experiments, grouped under their subtree.
    assert "  ~ max_step: 300 -> 750000\n" in out
    assert "  ~ train_dtype: 'jax.numpy.float32' -> 'jax.numpy.bfloat16'\n" in out
    assert "[mesh_rules]\n" in out
    assert "[model.decoder]\n" in out


def test_diff_config_with_itself_is_silent(capsys):
    assert main(["config", "diff", *TINY, "--config=gpt-tiny"]) == 0
    assert capsys.readouterr().out == ""


def test_diff_dump_files(tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    assert main(["config", "dump", *TINY, f"--output={a}"]) == 0
    b.write_text(a.read_text().replace("\nmax_step: 300\n", "\nmax_step: 20\n"))
    capsys.readouterr()
    assert main(["config", "diff", str(a), str(a)]) == 0
    assert main(["config", "diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "1 changed (~), 0 only in" in out
    assert "  ~ max_step: 300 -> 20" in out


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--config=gpt-tiny"], "needs --config twice"),
        (["a.txt"], "takes two dump files"),
        (["/nonexistent/a", "/nonexistent/b"], "Cannot read dump '/nonexistent/a'"),
        (["--module=text.gpt.tiny", "--config=gpt-tiny", "--config=nope"], "nope"),
    ],
)
def test_diff_errors_exit_2(argv, match, capsys):
    assert main(["config", "diff", *argv]) == 2
    assert match in capsys.readouterr().err


def test_diff_bad_dump_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("a: 1\nthis is not a dump line\n")
    assert main(["config", "diff", str(bad), str(bad)]) == 2
    assert f"{bad}:2: not a config dump line" in capsys.readouterr().err


def test_list_without_module_lists_every_experiment(capsys):
    assert main(["config", "list"]) == 0
    out = capsys.readouterr().out
    assert "axlearn.experiments.text.gpt.tiny\n  gpt-tiny\n" in out
    assert "axlearn.experiments.text.gpt.honeycrisp\n  honeycrisp-3B\n" in out


def test_dump_init_and_regularizer(tmp_path, capsys):
    assert main(["config", "dump", *TINY, "--init"]) == 0
    init = capsys.readouterr().out.splitlines()
    assert init[0].startswith("decoder/emb/token_emb/weight: normal(0, 1.0 / fan_out)")
    assert main(["config", "dump", *TINY, "--regularizer"]) == 0
    reg = capsys.readouterr().out.splitlines()
    assert reg[0] == "====================weight_decay_scale root.optimizer===================="
    assert reg[1] == "decoder/emb/token_emb/weight: 1"
    # The same texts as the checked-in goldens.
    out = tmp_path / "reg.txt"
    assert main(["config", "dump", *TINY, "--regularizer", f"--output={out}"]) == 0
    golden = pathlib.Path(__file__).parents[2] / (
        "experiments/testdata/axlearn.experiments.text.gpt.tiny/gpt-tiny_regularizer.txt"
    )
    with open(golden, encoding="utf-8") as f:
        assert out.read_text() == f.read()
    with pytest.raises(SystemExit):
        main(["config", "dump", *TINY, "--init", "--regularizer"])


def test_diff_of_trainer_dirs_and_of_a_file_that_is_not_a_dump(tmp_path, capsys):
    """Issue 29 case 13: `config diff` on a file that is not a dump says what a dump is, in one
    line; a trainer dir stands for its record's `trainer_config`."""
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    run_a.mkdir()
    run_b.mkdir()
    assert main(["config", "dump", *TINY, f"--output={run_a / 'trainer_config'}"]) == 0
    text = (run_a / "trainer_config").read_text()
    (run_b / "trainer_config").write_text(text.replace("\nmax_step: 300\n", "\nmax_step: 20\n"))
    capsys.readouterr()
    assert main(["config", "diff", str(run_a), str(run_b)]) == 1
    assert "  ~ max_step: 300 -> 20" in capsys.readouterr().out
    flags = run_a / "launch_trainer_flags"
    flags.write_text('{\n  "module": "text.gpt.tiny"\n}\n')
    assert main(["config", "diff", str(flags), str(run_b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flags}:1: not a config dump line" in err[0]
    assert "config diff compares two config dumps: a trainer dir" in err[0]


def test_diff_refuses_binary_and_oversized_input(tmp_path, capsys, monkeypatch):
    """Issue 38: `config diff` of a binary file is one line (not a UnicodeDecodeError traceback)
    and of `/dev/zero` (or any oversized input) a refusal before reading it whole."""
    good = tmp_path / "good.txt"
    good.write_text("a: 1\n")
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("a: caf\xe9\n".encode("latin-1"))
    for path, expect in [
        (binary, "is a binary file, not a config dump"),
        (latin, "is not UTF-8 text (byte 6)"),
        ("/dev/zero", "/dev/zero is a binary file"),
    ]:
        assert main(["config", "diff", str(path), str(good)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expect in err[0], err
    monkeypatch.setattr("axlearn.cli.config_commands.MAX_DUMP_BYTES", 3 * 2**20)
    big = tmp_path / "big.txt"
    big.write_text("a: 1\n" * (2**20))
    assert main(["config", "diff", str(big), str(good)]) == 2
    assert "is over 3 MiB: not a config dump" in capsys.readouterr().err
