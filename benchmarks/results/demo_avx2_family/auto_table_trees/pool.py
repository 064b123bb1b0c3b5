"""Experiment for rows.py's old_* rows (PATCH=this file): the table inside auto drafts the best-first pool of
max_nodes nodes (its shape planned at a flat verify cost), and auto's planner alone sizes what is verified."""
import contextlib
from unittest import mock
import specdec.strategies.token_recycling as T

def plan(self, state):
    temperature = state.sampling.temperature
    costs = self.costs_at(max(1, state.batch_size))
    flat = costs.verify_cost(0)
    return T.plan_shape(lambda depth, rank: self.accept_rate(depth, rank, temperature), self.k, self.max_nodes,
                        self.max_depth, lambda nodes: flat, self.draft_cost_s, chain=self.chains)

@contextlib.contextmanager
def undone():
    with mock.patch.object(T.TokenRecycling, "plan", plan):
        yield
