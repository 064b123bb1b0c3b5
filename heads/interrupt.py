"""Ctrl-C during training: the trainers save a checkpoint of the last finished step and raise
TrainingInterrupted; the command prints how to resume and exits 130 (the shell's code for SIGINT)."""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading

from specdec.log import log_to_stderr

EXIT_INTERRUPTED = 130


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training; the checkpoint of the last finished step is written (a
    KeyboardInterrupt still, so a program calling the trainer stops as it would have)."""

    def __init__(self, step: int, steps: int, checkpoint: str):
        super().__init__(f"training interrupted after step {step} of {steps}; checkpoint {checkpoint}")
        self.step, self.steps, self.checkpoint = step, steps, checkpoint


def stop_training(bar, step: int, step_began: int, generator, rng_before, save, steps: int, checkpoint: str):
    """What both trainers do on Ctrl-C: close the progress bar; a step stopped before its update
    gives the window sampler its state back (the step is redone on resume, as an uninterrupted run
    would draw it); `save()` writes the checkpoint of the last finished step; then raise
    TrainingInterrupted."""
    bar.close()
    if step == step_began:
        generator.set_state(rng_before)
    save()
    raise TrainingInterrupted(step, steps, checkpoint) from None


@contextlib.contextmanager
def deferred_interrupt():
    """Hold a Ctrl-C back until the block has run, so that the parameters and the optimizer are
    never saved half updated. Only where Python's own SIGINT handler is in place (the main thread,
    no handler of the caller's): elsewhere the block runs as it is."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    received = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


def resume_command(prefix: str, argv: list[str], output_dir: str) -> str:
    """The command line that resumes a run: the same arguments with output_dir made absolute (a
    run with the checkpoint's output_dir resumes from it, from any folder)."""
    args = [a for a in argv if not a.startswith("output_dir=")]
    return " ".join([prefix, shlex.join(args + [f"output_dir={os.path.abspath(output_dir)}"])]).strip()


def report_interrupt(stop: KeyboardInterrupt, prefix: str, argv: list[str], output_dir: str | None) -> int:
    """Print what was saved and how to resume (standard error); returns the exit code, 130."""
    if isinstance(stop, TrainingInterrupted):
        print(f"\ninterrupted after step {stop.step} of {stop.steps}: checkpoint saved in {stop.checkpoint}\n"
              f"resume with: {resume_command(prefix, argv, output_dir)}", file=sys.stderr)
    else:
        print("\ninterrupted before any training step ran: nothing new was saved", file=sys.stderr)
    return EXIT_INTERRUPTED


def training_main(argv: list[str] | None, *, show_help, load_config, train, cli: str, module: str, saved: str) -> int:
    """The command line of a trainer (`specdec train-heads`, `train_eagle`, `specdec train-draft`):
    [CONFIG_NAME_OR_YAML] [key=value ...], -h / --help (show_help(name) prints the keys), the
    config loaded by load_config(name, overrides) and trained by train(cfg) -> folder; Ctrl-C ends
    with the command that resumes the run (a torchrun one when several ranks ran `module`), and only
    rank 0 reports. `saved` formats the last line with {folder}."""
    log_to_stderr()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = list(argv)
    name = None
    if argv and "=" not in argv[0] and argv[0] not in ("-h", "--help"):
        name, argv = argv[0], argv[1:]
    if any(arg in ("-h", "--help") for arg in argv):
        show_help(name)
        return 0
    cfg = None
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = load_config(name, argv)
        folder = train(cfg)
    except KeyboardInterrupt as stop:
        if rank != 0:
            return EXIT_INTERRUPTED
        world = int(os.environ.get("WORLD_SIZE", "1"))
        prefix = f"torchrun --nproc_per_node={world} -m {module}" if world > 1 else cli
        return report_interrupt(stop, prefix, command, cfg.output_dir if cfg is not None else None)
    if rank == 0:
        print(saved.format(folder=folder))
    return 0
