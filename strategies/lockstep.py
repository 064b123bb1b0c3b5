"""Tree builders as step generators, so that many rows of a batch can build their trees side by side.

A builder (strategies.best_first.best_first_steps, strategies.sampled_tree.sampled_tree_steps) yields
one request per tree level - the nodes whose children it needs - and takes the answer by send(); it
returns its CandidateTree. `run_steps` answers one builder's requests one at a time (a row drafting
alone); `run_together` answers every row's request of a round at once, so a batch runs ONE drafter
forward per level for all its rows (strategies/eagle_batch.py) with each row's tree exactly what it
builds alone.
"""
from __future__ import annotations

from typing import Any, Callable, Generator, Sequence

Steps = Generator[tuple, Any, Any]


def run_steps(steps: Steps, answer: Callable[..., Any]):
    """Drive one builder: answer(*request) for each of its requests; its result."""
    try:
        request = next(steps)
        while True:
            request = steps.send(answer(*request))
    except StopIteration as done:
        return done.value


def run_together(builders: Sequence[Steps], answer_all: Callable[[dict[int, tuple]], dict[int, Any]]) -> list:
    """Drive several builders in lockstep: each round, answer_all({builder index: its request}) answers
    the requests of every builder still going (one batched forward); their results, in order."""
    results: list = [None] * len(builders)
    requests: dict[int, tuple] = {}

    def advance(index: int, answer=None, first: bool = False) -> None:
        try:
            requests[index] = next(builders[index]) if first else builders[index].send(answer)
        except StopIteration as done:
            results[index] = done.value

    for index in range(len(builders)):
        advance(index, first=True)
    while requests:
        round_requests, requests = requests, {}
        for index, answer in answer_all(round_requests).items():
            advance(index, answer)
    return results
