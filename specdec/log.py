"""The library's messages go to the logger "specdec" (each module logs to logging.getLogger(__name__),
a child of it), never to print. A program that uses specdec configures logging as it likes; with
nothing configured Python shows warnings on standard error and drops the rest. The command lines
(`specdec ...`, the trainers' own entry points, the demo) call log_to_stderr(), so their users see
the progress messages as plain lines on standard error, as before."""
from __future__ import annotations

import logging
import sys

LOGGER = "specdec"


class _Stderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a message comes (a redirect, pytest's capture)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def log_to_stderr(level: int = logging.INFO) -> None:
    """Show the library's messages of `level` and above on standard error, one plain line each
    (once: calling it again only sets the level)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
