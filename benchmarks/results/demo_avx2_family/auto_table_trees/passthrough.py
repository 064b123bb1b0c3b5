"""Experiment for rows.py's old_* rows (PATCH=this file): where lookup offers no path and auto called the token table,
auto verifies the table's tree as the table planned it (its own shape planner), not auto's replan of it."""
import contextlib
from unittest import mock
import specdec.strategies.auto as auto_module
from specdec.strategies.auto import Auto

orig_end = Auto.propose_end
real_plan = auto_module.plan


def full_plan(parents, accept, *args, **kwargs):
    keep, rate = real_plan(parents, accept, *args, **kwargs)
    return list(range(len(parents))), rate


def propose_end(self, state, neural_tree, drafted_s):
    started = self.started
    called = self.called
    if (started is not None and not started[0] and called is not None
            and type(called.drafter).__name__ == "TokenRecycling"):
        with mock.patch.object(auto_module, "plan", full_plan):
            return orig_end(self, state, neural_tree, drafted_s)
    return orig_end(self, state, neural_tree, drafted_s)


@contextlib.contextmanager
def undone():
    with mock.patch.object(Auto, "propose_end", propose_end):
        yield
