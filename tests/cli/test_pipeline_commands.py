"""Tests of axlearn.cli.pipeline_commands (`axlearn pipeline ticks`)."""

from axlearn.cli.main import main
from axlearn.common.pipeline_1f1b import tick_table


def test_ticks_prints_table_and_bubble(capsys):
    assert main(["pipeline", "ticks", "--num_stages=4", "--num_microbatches=8"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = tick_table(4, 1, 8)
    assert out[0] == "OneFOneBSchedule"
    assert len(out) == 2 + table["num_ticks"] + 1  # Name, header, ticks, summary.
    # Tick 3: the last stage runs the forward and the backward of microbatch 0.
    assert out[5].split() == ["3", "F3", ".", "F2", ".", "F1", ".", "F0", "B0"]
    assert out[-1].endswith("bubble fraction 0.2727 (= (S-1)/(V*M+S-1))")
    assert "ring of 7 residual slots" in out[-1]


def test_ticks_interleaved_and_named_config(capsys):
    args = ["pipeline", "ticks", "--schedule=interleaved_1f1b", "--num_stages=2"]
    assert main(args + ["--num_microbatches=4", "--num_virtual_stages=2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("InterleavedOneFOneBSchedule\n") and "F0.1" in out
    assert (
        main(["pipeline", "ticks", "--module=text.gpt.c4_trainer", "--config=gspmd-16B-2x16x8"])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "model.decoder.transformer:" and out[1] == "GPipeSchedule"


def test_ticks_bad_input_one_line(capsys):
    args = ["pipeline", "ticks", "--schedule=interleaved_1f1b", "--num_stages=4"]
    assert main(args + ["--num_microbatches=6", "--num_virtual_stages=2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_microbatches=6 is not a multiple of num_stages=4" in err[0]
    assert main(["pipeline", "ticks", "--num_stages=4"]) == 1
    assert "pass --num_stages and --num_microbatches" in capsys.readouterr().err
    assert (
        main(
            [
                "pipeline",
                "ticks",
                "--schedule=1f1b",
                "--num_stages=2",
                "--num_microbatches=2",
                "--num_virtual_stages=2",
            ]
        )
        == 1
    )
    assert "set num_virtual_stages=1 or use interleaved_1f1b" in capsys.readouterr().err
