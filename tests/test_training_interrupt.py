"""Ctrl-C in the middle of a training step (Medusa heads, EAGLE drafter): the command saves a
checkpoint of the last finished step, prints the command that resumes it and exits 130 without a
traceback; that command continues from the saved step and ends where an uninterrupted run ends."""
from __future__ import annotations

import os
import shlex
import signal

import pytest
import torch

from zoo import count_windows, tiny_training_target
from specdec.cli import main as cli_main
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.interrupt import deferred_interrupt, resume_command


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_interrupt")
    return tiny_training_target(root)


def medusa_args(target, corpus):
    return [f"target={target}", f"corpus=[{os.path.join(corpus, 'm0.py')},{os.path.join(corpus, 'm1.py')}]",
            f"heldout=[{os.path.join(corpus, 'm2.py')}]", "num_heads=2", "seq_len=24", "batch_size=2", "steps=5",
            "warmup_steps=1", "eval_interval=100", "eval_windows=2", "checkpoint_interval=100", "progress=false"]


def eagle_args(target, corpus):
    config = os.path.join(os.path.dirname(corpus), "eagle.yaml")     # a YAML with `drafter: eagle` picks the trainer
    with open(config, "w") as f:
        f.write("drafter: eagle\n")
    return [config, f"target={target}", f"corpus=[{os.path.join(corpus, 'm0.py')},{os.path.join(corpus, 'm1.py')}]",
            f"heldout=[{os.path.join(corpus, 'm2.py')}]", "layout=eagle1", "seq_len=24", "batch_size=2", "steps=5",
            "warmup_steps=1", "eval_interval=100", "eval_windows=2", "eval_new_tokens=8", "eval_depth=2",
            "ttt_steps=2", "checkpoint_interval=100", "progress=false"]


KINDS = {  # the trainer's arguments, its checkpoint file
    "medusa": (medusa_args, "checkpoint.safetensors"),
    "eagle": (eagle_args, "eagle_checkpoint.safetensors"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_ctrl_c_saves_a_checkpoint_and_prints_the_command_that_resumes(kind, tiny_target, tmp_path, monkeypatch,
                                                                     capsys):
    args, checkpoint_file = KINDS[kind]
    args = args(*tiny_target)
    straight = str(tmp_path / "straight")
    assert cli_main(["train-heads", *args, f"output_dir={straight}"]) == 0

    interrupted = str(tmp_path / "interrupted")
    with monkeypatch.context() as mp:
        count_windows(mp, interrupt_at=4)          # Ctrl-C inside step 4: steps 1-3 are finished
        capsys.readouterr()
        code = cli_main(["train-heads", *args, f"output_dir={interrupted}"])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    checkpoint = os.path.join(interrupted, checkpoint_file)
    assert read_checkpoint(checkpoint)["step"] == 3
    assert f"interrupted after step 3 of 5: checkpoint saved in {checkpoint}" in err
    resume = [line for line in err.splitlines() if line.startswith("resume with: ")]
    assert len(resume) == 1
    command = shlex.split(resume[0][len("resume with: "):])
    assert command[:2] == ["specdec", "train-heads"] and f"output_dir={os.path.abspath(interrupted)}" in command

    with monkeypatch.context() as mp:
        drawn = count_windows(mp)
        assert cli_main(command[1:]) == 0
    assert len(drawn) == 2                                  # steps 4 and 5 only: it went on from step 3
    a = read_checkpoint(os.path.join(straight, checkpoint_file))
    b = read_checkpoint(checkpoint)
    assert a["step"] == b["step"] == 5
    for name in a["module"]:                                # the interrupted step was redone as it would have run
        torch.testing.assert_close(a["module"][name], b["module"][name], rtol=0, atol=1e-6)
    assert torch.equal(a["window_rng"], b["window_rng"])


def test_ctrl_c_while_loading_exits_130_without_a_traceback(tiny_target, tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("specdec.heads.loop.load_model", interrupted)
    code = cli_main(["train-heads", *medusa_args(*tiny_target), f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 130 and "nothing new was saved" in err and "Traceback" not in err


def test_a_signal_during_the_update_is_held_until_it_is_whole():
    # Python's own handler, as in an interactive run: a runner started in the background (CI, nohup)
    # may have SIGINT ignored, where a Ctrl-C never arrives and nothing is held back
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt):
            with deferred_interrupt():
                os.kill(os.getpid(), signal.SIGINT)
                done.append("update finished")
        assert done == ["update finished"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_resume_command_makes_output_dir_absolute():
    command = resume_command("specdec train-heads", ["train_heads", "target=/m x", "output_dir=rel"], "rel")
    assert shlex.split(command) == ["specdec", "train-heads", "train_heads", "target=/m x",
                                    f"output_dir={os.path.abspath('rel')}"]
