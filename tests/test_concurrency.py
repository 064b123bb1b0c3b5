"""One Speculator, many callers: calls from threads (and interleaved streams) each return exactly
what they return alone, for every strategy and both samplers; an abandoned stream holds nothing
back; and the same checks fail with the guard switched off (the negative control)."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch

import specdec.api as api
from zoo import random_heads
from conftest import char_tokenizer, noisy_copy, rest_datastore, tiny_model
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec.strategies.auto import Auto
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.strategies.medusa import Medusa
from specdec.strategies.planner import Calibrator
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.strategies.suffix import Suffix
from specdec.strategies.token_recycling import TokenRecycling
from specdec.strategies.lookahead import Lookahead
from specdec.strategies.rest import Rest

THREADS, CALLS = 8, 4
PROMPTS = ["def parse(text):\n    return text", "class Foo:\n    x = 1\n    y = 2", "for i in range(10):\n    print(i)",
           "import os\nimport sys\n", "a = b = c = 1; a = b = c", "while True:\n    pass"]
STRATEGIES = ["autoregressive", "prompt_lookup", "draft_chain", "draft_tree", "medusa", "eagle", "auto", "suffix",
              "token_recycling", "lookahead", "rest", "auto_paired"]


def _target():
    return tiny_model("llama", seed=1, sharpen=4.0)




def build(name: str) -> Speculator:
    target = _target()
    strategy = {
        "autoregressive": lambda: Autoregressive(),
        "prompt_lookup": lambda: PromptLookup(min_ngram=1, max_ngram=2),
        "draft_chain": lambda: DraftModel(noisy_copy(target), num_tokens=3),
        "draft_tree": lambda: DraftModel(noisy_copy(target), branching=[2, 2, 1]),
        "medusa": lambda: Medusa(random_heads(target), max_nodes=6, top_k=2),
        "eagle": lambda: Eagle(random_drafter(target), max_nodes=6, top_k=2, depth=4),
        "auto": lambda: Auto(PromptLookup(), DraftModel(noisy_copy(target), num_tokens=3), profile=False),
        # the table and a draft model: greedy steps are led by the paired judge, shared by the calls
        "auto_paired": lambda: Auto(PromptLookup(), TokenRecycling(profile=False), profile=False,
                                    more_drafters=[DraftModel(noisy_copy(target), num_tokens=3)]),
        "suffix": lambda: Suffix(),
        "token_recycling": lambda: TokenRecycling(profile=False),
        "lookahead": lambda: Lookahead(window=3, ngram=3, guesses=2),
        "rest": lambda: Rest(rest_datastore(tuple(PROMPTS)), min_match=1, max_nodes=6),
    }[name]()
    return Speculator(target, char_tokenizer(), strategy)


def jobs(count: int, seed: int = 0) -> list[dict]:
    """Mixed calls: greedy, seeded rejection sampling, coupled sampling, stop strings; prompts and
    lengths differ; some are streamed."""
    rng = random.Random(seed)
    kinds = [dict(temperature=0.0), dict(temperature=0.9, top_k=20, sampler="rejection"),
             dict(temperature=0.9, top_p=0.9, sampler="coupled"), dict(temperature=0.0, stop=["\n", "e"])]
    return [dict(prompt=rng.choice(PROMPTS), max_new_tokens=rng.randint(6, 24), seed=rng.randint(0, 10 ** 6),
                 ignore_eos=True, stream=i % 3 == 0, **kinds[i % len(kinds)]) for i in range(count)]


def call(sd: Speculator, job: dict) -> tuple:
    kwargs = {k: v for k, v in job.items() if k not in ("prompt", "stream")}
    if job["stream"]:
        stream = sd.stream(job["prompt"], **kwargs)
        text = "".join(stream)
        return tuple(stream.token_ids), text, stream.finish_reason
    out = sd.generate(job["prompt"], **kwargs)
    return tuple(out.token_ids), out.text, out.finish_reason


def comparable(name: str, job: dict) -> bool:
    """Whether a call's output is fixed by its arguments alone: everywhere except auto, suffix and
    token_recycling under the rejection sampler, whose trees (and so which sample a seed gives) follow
    what they learned from earlier calls; their law is the target's all the same (the exact-law tests)."""
    return not (name in ("auto", "auto_paired", "suffix", "token_recycling") and job["temperature"] > 0
                and job.get("sampler") == "rejection")


def slow_steps(sd: Speculator):
    """Each target forward yields the GIL for a moment, so calls from threads overlap at every step."""
    return sd.target.register_forward_pre_hook(lambda module, args: time.sleep(0.0005))


def hammer(sd: Speculator, work: list[dict]) -> dict[int, object]:
    """THREADS threads x CALLS calls each on one Speculator, started together: {job index: output or
    the exception raised}."""
    results: dict[int, object] = {}
    barrier = threading.Barrier(THREADS)

    def worker(t: int):
        barrier.wait()
        for i in range(t * CALLS, (t + 1) * CALLS):
            try:
                results[i] = call(sd, work[i])
            except Exception as exc:  # noqa: BLE001 - recorded: the test fails on any
                results[i] = exc

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a call never returned"
    return results


def wrong_calls(name: str, sd: Speculator, work: list[dict], reference: list[tuple]) -> list[str]:
    handle = slow_steps(sd)
    try:
        results = hammer(sd, work)
    finally:
        handle.remove()
    wrong = []
    for i, job in enumerate(work):
        got = results.get(i)
        if isinstance(got, Exception):
            wrong.append(f"call {i} raised {type(got).__name__}: {got}")
        elif comparable(name, job) and got != reference[i]:
            wrong.append(f"call {i} ({job}) returned {got!r}, alone {reference[i]!r}")
        elif len(got[0]) > job["max_new_tokens"] or not got[0]:
            wrong.append(f"call {i} returned {len(got[0])} tokens for max_new_tokens={job['max_new_tokens']}")
    return wrong


@pytest.mark.parametrize("name", STRATEGIES)
def test_threads_sharing_a_speculator_get_what_they_get_alone(name):
    sd = build(name)
    work = jobs(THREADS * CALLS, seed=STRATEGIES.index(name))
    reference = [call(sd, job) for job in work]              # sequential, one call at a time
    assert any(job["temperature"] > 0 for job in work) and any(job.get("stop") for job in work)
    assert wrong_calls(name, sd, work, reference) == []
    # and the Speculator is whole afterwards
    again = [(call(sd, job), ref) for job, ref in zip(work[:6], reference) if comparable(name, job)]
    assert again and all(got == ref for got, ref in again)
    if name == "auto_paired":                                # the calls' greedy steps went through the paired judge
        assert sd.strategy.paired_leaders["greedy"].table_steps


def test_without_the_guard_the_same_check_fails(monkeypatch):
    """Negative control: with the lock and the per-call state switched off, threads corrupt each
    other's calls, and the check above sees it."""
    sd = build("autoregressive")
    work = jobs(THREADS * CALLS, seed=0)
    reference = [call(sd, job) for job in work]
    monkeypatch.setattr(api, "CONCURRENCY_GUARD", False)
    assert wrong_calls("autoregressive", sd, work, reference) != []


@pytest.mark.parametrize("guard", [True, False])
def test_streams_interleaved_step_by_step(monkeypatch, guard):
    """Two streams advanced alternately in one thread: exact with the guard, wrong without it."""
    monkeypatch.setattr(api, "CONCURRENCY_GUARD", guard)
    sd = build("draft_chain")
    kwargs = dict(max_new_tokens=20, ignore_eos=True)
    alone = [sd.generate(p, **kwargs).token_ids for p in PROMPTS[:2]]
    streams = [sd.stream(p, **kwargs) for p in PROMPTS[:2]]
    try:
        while any(not s._done for s in streams):
            for s in streams:
                s._advance()
        together = [s.token_ids for s in streams]
    except Exception:  # noqa: BLE001 - without the guard a corrupted cache may also raise
        together = None
    assert (together == alone) is guard


def test_an_abandoned_stream_blocks_nobody():
    sd = build("eagle")
    kwargs = dict(max_new_tokens=24, ignore_eos=True)
    expected = [sd.generate(p, **kwargs).text for p in PROMPTS[:3]]
    texts: dict[str, str] = {}
    abandoned_started = threading.Event()

    def abandon():
        stream = sd.stream(PROMPTS[1], **kwargs)
        next(stream)                 # half-way, then never iterated, closed or finished
        abandoned_started.set()
        texts["abandoned"] = stream.text
        time.sleep(0.5)              # still referenced while the others run

    def finish():
        abandoned_started.wait(60)
        texts["other"] = "".join(sd.stream(PROMPTS[0], **kwargs))

    threads = [threading.Thread(target=abandon), threading.Thread(target=finish)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert texts["other"] == expected[0]
    assert expected[1].startswith(texts["abandoned"])
    assert sd.generate(PROMPTS[2], **kwargs).text == expected[2]     # a third call afterwards completes
    assert not sd._own_in_use                                         # the dropped stream gave its state back


def test_a_closed_stream_gives_its_state_back():
    sd = build("prompt_lookup")
    stream = sd.stream(PROMPTS[0], max_new_tokens=16)
    next(stream)
    assert sd._own_in_use
    stream.close()
    assert not sd._own_in_use
    held = sd.stream(PROMPTS[0], max_new_tokens=16)
    next(held)
    del held                                                          # dropped unfinished
    assert not sd._own_in_use


def test_shared_calibration_stays_consistent_under_threads():
    """Auto's calibration is shared by every call: hammered from threads, no update is lost and
    no read sees half of one (kept <= tried in every bucket, estimates within [0, 1])."""
    calibrator = Calibrator(prior=2.0, decay=1.0)
    keys = [calibrator.key("lookup", 0.0, None, depth) for depth in range(4)]
    records, threads_n = 2000, 8
    bad_reads: list[float] = []

    def worker(seed: int):
        rng = random.Random(seed)
        for _ in range(records):
            key = rng.choice(keys)
            calibrator.record(key, rng.random() < 0.5)
            estimate = calibrator.estimate(key, None, 0.5)
            if not 0.0 <= estimate <= 1.0:
                bad_reads.append(estimate)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert bad_reads == []
    assert sum(calibrator.tried[k] for k in keys) == records * threads_n      # decay 1: plain counts
    assert all(calibrator.kept[k] <= calibrator.tried[k] for k in keys)


@pytest.mark.slow          # compiles the verify forward twice (the overlapping call's twin): a minute or more
def test_compiled_verifier_streams_interleaved():
    """compile: true keeps a static cache per call too (an overlapping call compiles its own)."""
    from specdec.compiled import compile_problem
    if compile_problem("cpu"):
        pytest.skip(f"torch.compile does not work here: {compile_problem('cpu')}")
    target = _target()
    sd = Speculator(target, char_tokenizer(), DraftModel(noisy_copy(target), num_tokens=3), compile=True)
    kwargs = dict(max_new_tokens=12, ignore_eos=True)
    alone = [sd.generate(p, **kwargs).token_ids for p in PROMPTS[:2]]
    streams = [sd.stream(p, **kwargs) for p in PROMPTS[:2]]
    while any(not s._done for s in streams):
        for s in streams:
            s._advance()
    assert [s.token_ids for s in streams] == alone
