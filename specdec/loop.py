"""The decoding loop: prefill, then propose -> verify -> accept -> commit -> observe, until a stop
rule fires inside an accepted run."""
from __future__ import annotations

import time
from typing import Iterator

import torch

from .acceptance import accept_greedy, accept_sampling
from .sampling import SamplingParams, TorchRandom, logits_to_probs
from .stopping import StopRules
from .types import DecodeState, Stats, StepResult
from .verifier import Verifier


class _Clock:
    """Wall time that waits for queued GPU work, so the draft/verify split is honest on CUDA."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def __call__(self) -> float:
        self.sync()
        return time.perf_counter()


def decode(verifier: Verifier, strategy, prompt_ids: list[int], sampling: SamplingParams,
           stop: StopRules, generator: torch.Generator, stats: Stats) -> Iterator[tuple[list[int], str | None]]:
    """Yield (new tokens, finish reason or None) once per verify step; `stats` fills as it goes."""
    clock = _Clock(verifier.device)
    start = clock()
    verifier.prefill(prompt_ids[:-1])
    stats.prefill_time_s = clock() - start
    state = DecodeState(token_ids=list(prompt_ids), prompt_len=len(prompt_ids), sampling=sampling,
                        generator=generator, max_depth=stop.max_new_tokens - 1,
                        eos_token_ids=stop.eos_token_ids)
    rng = TorchRandom(generator)
    t = clock()
    strategy.reset(state)
    stats.draft_time_s += clock() - t
    while True:
        t0 = clock()
        tree = strategy.propose(state)
        if tree.num_nodes and max(tree.depths()) >= state.max_depth:
            tree = tree.prune_depth(state.max_depth)
        t1 = clock()
        out = verifier.forward(state.token_ids[-1], tree, want_hidden=strategy.needs_hidden_states)
        t2 = clock()
        tree_tokens = tree.tokens.tolist()
        if sampling.greedy:
            verdict = accept_greedy(tree, out.logits.argmax(dim=-1).tolist(), tree_tokens)
        else:
            verdict = accept_sampling(tree, logits_to_probs(out.logits, sampling), rng, tree_tokens)
        verifier.commit([0] + [node + 1 for node in verdict.accepted])

        run = [tree_tokens[node] for node in verdict.accepted] + [verdict.next_token]
        generated = state.token_ids[state.prompt_len:]
        keep, reason = stop.cut(generated, run)
        run = run[:keep]
        stats.target_forwards += 1
        stats.proposed_nodes += tree.num_nodes
        stats.accepted_lengths.append(len(verdict.accepted))
        stats.new_tokens += len(run)
        stats.verify_time_s += t2 - t1
        committed_before = len(state.token_ids)
        state.token_ids.extend(run)
        if reason is not None:
            stats.draft_time_s += t1 - t0
            stats.total_time_s = clock() - start
            yield run, reason
            return
        state.max_depth = stop.max_new_tokens - state.num_generated - 1
        if out.hidden is not None:
            state.last_hidden = out.hidden[verdict.last_row]
        t3 = clock()
        strategy.observe(state, StepResult(tree, verdict.accepted, verdict.next_token, committed_before))
        stats.draft_time_s += (t1 - t0) + (clock() - t3)
        stats.total_time_s = clock() - start
        yield run, None
