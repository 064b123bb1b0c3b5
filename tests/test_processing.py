"""The checkpoint's generation_config processing (repetition penalty, no-repeat n-grams, suppressed
tokens, bad words, min_new_tokens): every strategy's greedy output equals the model's own
`generate()` with the same generation_config, and drafts are processed like the target."""
from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch

from conftest import char_tokenizer, hf_greedy, noisy_copy, tiny_model
from specdec import Speculator
from specdec.benchmarks.peers import HFRow
from specdec.benchmarks.rows import SpecdecRow
from specdec.errors import InputError
from specdec.processing import LogitsProcessing, generation_processors
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tree import CandidateTree

N = 32
PROMPT = [5, 17, 33, 9, 41, 60, 5, 17, 33, 9, 70, 12, 5, 17]
STRATEGIES = ["autoregressive", "prompt_lookup", "chain", "tree"]


@lru_cache(maxsize=None)
def base_model():
    return tiny_model("llama", seed=0, sharpen=3.0)


@lru_cache(maxsize=None)
def plain_reference() -> tuple[int, ...]:
    return tuple(hf_greedy(base_model(), PROMPT, N, eos_token_id=None))


def settings(name: str) -> dict:
    """generation_config fields of each case; banned tokens are taken from the plain greedy
    continuation so that each setting changes the output."""
    plain = plain_reference()
    if name == "repetition_penalty":
        return dict(repetition_penalty=1.3)
    if name == "no_repeat_ngram":
        return dict(no_repeat_ngram_size=2)
    if name == "suppress_and_bad_words":
        return dict(suppress_tokens=[plain[2]], bad_words_ids=[[plain[5]], [plain[7], plain[8]]])
    if name == "chat":                  # a chat checkpoint's mild penalty plus the others together
        return dict(repetition_penalty=1.05, no_repeat_ngram_size=3, suppress_tokens=[plain[1]],
                    bad_words_ids=[[plain[4], plain[5]]])
    raise ValueError(name)


SETTINGS = ["repetition_penalty", "no_repeat_ngram", "suppress_and_bad_words", "chat"]


@lru_cache(maxsize=None)
def processed_model(name: str):
    model = copy.deepcopy(base_model())
    model.generation_config.update(**settings(name))
    return model



def strategy_of(name: str, target, draft=None):
    draft = draft if draft is not None else noisy_copy(base_model(), noise=0.2)   # a draft without the settings
    if name == "autoregressive":
        return Autoregressive()
    if name == "prompt_lookup":
        return PromptLookup()
    if name == "chain":
        return DraftModel(draft, num_tokens=4)
    return DraftModel(draft, branching=[2, 2, 1, 1])


# ---------------------------------------------------------------------- greedy identity
@pytest.mark.parametrize("name", SETTINGS)
def test_setting_changes_the_output(name):
    """Precondition: each generation_config changes HF's own greedy output."""
    assert hf_greedy(processed_model(name), PROMPT, N, eos_token_id=None) != list(plain_reference())


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("name", SETTINGS)
def test_processed_greedy_identity(name, strategy_name):
    target = processed_model(name)
    expected = hf_greedy(target, PROMPT, N, eos_token_id=None)
    out = Speculator(target, None, strategy_of(strategy_name, target)).generate(PROMPT, max_new_tokens=N,
                                                                                ignore_eos=True)
    assert out.token_ids == expected
    if strategy_name != "autoregressive":
        assert out.stats.proposed_nodes > 0
    if strategy_name in ("chain", "tree"):
        assert sum(out.stats.accepted_lengths) > 0


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_draft_distributions_are_processed(shape):
    """A draft that is the target itself proposes exactly the target's processed argmax, so every
    drafted token is accepted, only if its distributions are processed like the target's."""
    target = processed_model("chat")
    out = Speculator(target, None, strategy_of(shape, target, draft=base_model())).generate(
        PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    depth = 4
    assert out.stats.accepted_lengths[:-1] == [depth] * (len(out.stats.accepted_lengths) - 1)


def test_min_new_tokens_holds_eos_back():
    from test_greedy_identity import with_eos_at
    made = with_eos_at(base_model(), PROMPT, at_least=4, n=N)
    assert made is not None, "precondition: a continuation that can be made to end in EOS"
    target, at, _ = made
    assert hf_greedy(target, PROMPT, N)[-1] == 2, "precondition: plain greedy stops at EOS"
    target.generation_config.update(min_new_tokens=at + 6, repetition_penalty=1.1)
    expected = hf_greedy(target, PROMPT, N)
    assert len(expected) > at + 1, "precondition: min_new_tokens moves the stop"
    for strategy_name in STRATEGIES:
        out = Speculator(target, None, strategy_of(strategy_name, target)).generate(PROMPT, max_new_tokens=N)
        assert out.token_ids == expected, strategy_name


# ---------------------------------------------------------------------- rows and cost
def test_tree_rows_equal_row_by_row_processing():
    model = processed_model("chat")
    committed = PROMPT + [8, 9]
    processing = LogitsProcessing.for_generation(model, PROMPT, N)
    assert len(processing.processors) == 4
    tree = CandidateTree(torch.tensor([11, 12, 13, 14, 9, 16]), (-1, 0, -1, 1, 2, 4))
    logits = torch.randn(1 + tree.num_nodes, 96, generator=torch.Generator().manual_seed(0))
    processed = processing.tree_rows(logits, committed, tree)
    for row in range(1 + tree.num_nodes):
        path, node = [], row - 1
        while node != -1:
            path.append(int(tree.tokens[node]))
            node = tree.parents[node]
        ids = torch.tensor([committed + path[::-1]])
        expected = generation_processors(model, PROMPT, N)(ids, logits[row: row + 1].clone())[0]
        torch.testing.assert_close(processed[row], expected)


def test_nothing_asked_costs_nothing():
    model = base_model()
    processing = LogitsProcessing.for_generation(model, PROMPT, N)
    assert not processing and len(processing.processors) == 0
    logits = torch.randn(4, 96)
    tree = CandidateTree.chain([3, 4, 5])
    assert processing.tree_rows(logits, PROMPT, tree) is logits      # untouched: no per-row work
    assert processing.rows(logits, torch.zeros(4, 3, dtype=torch.long)) is logits


def test_unsupported_processor_refused():
    target = copy.deepcopy(base_model())
    target.generation_config.guidance_scale = 1.5           # classifier-free guidance: runs the model itself
    with pytest.raises(InputError, match="UnbatchedClassifierFreeGuidance"):
        Speculator(target, None, Autoregressive()).generate(PROMPT, max_new_tokens=4)


def test_unsupported_processor_fails_at_the_call_and_keeps_a_running_stream():
    """stream() refuses an unsupported generation_config when called (not when first iterated), and
    the refused call does not supersede the stream already running."""
    target = copy.deepcopy(base_model())
    sd = Speculator(target, char_tokenizer(), Autoregressive())
    running = sd.stream("abc", max_new_tokens=6, ignore_eos=True)
    first = next(running)
    target.generation_config.guidance_scale = 1.5
    with pytest.raises(InputError, match="UnbatchedClassifierFreeGuidance"):
        sd.stream("abc", max_new_tokens=4)
    rest = "".join(running)
    target.generation_config.guidance_scale = None
    assert first + rest == sd.generate("abc", max_new_tokens=6, ignore_eos=True).text


# ---------------------------------------------------------------------- benchmark rows
def test_bench_rows_use_the_same_generation_config():
    """HF's rows and ours generate the same tokens for a checkpoint whose generation_config asks
    for processing (every row runs to max_new_tokens, so EOS-bound settings are left out of both)."""
    from types import SimpleNamespace
    target = copy.deepcopy(processed_model("chat"))
    target.generation_config.update(min_new_tokens=N // 2)
    saved = target.generation_config.to_dict()
    entry = SimpleNamespace(kind="plain", prompt_lookup_num_tokens=None, max_matching_ngram_size=None)
    hf = HFRow("HF generate()", target, entry).generate(PROMPT, N, 0.0, 0)
    ours = SpecdecRow("draft", Speculator(target, None, strategy_of("tree", target))).generate(PROMPT, N, 0.0, 0)
    assert hf.token_ids == ours.token_ids
    assert hf.token_ids == hf_greedy(processed_model("chat"), PROMPT, N, eos_token_id=None)   # processed
    assert target.generation_config.to_dict() == saved                   # the rows leave it as it was


def test_sampling_keeps_suppressed_and_bad_words_out():
    """At temperature 1 the target's law is the processed one: a suppressed token and a banned
    bigram never appear, whatever the (unprocessed) draft proposes."""
    target = processed_model("suppress_and_bad_words")
    banned = settings("suppress_and_bad_words")
    sd = Speculator(target, None, strategy_of("tree", target))
    for seed in range(4):
        tokens = sd.generate(PROMPT, max_new_tokens=N, temperature=1.0, seed=seed, ignore_eos=True).token_ids
        assert len(tokens) == N
        assert banned["suppress_tokens"][0] not in tokens and banned["bad_words_ids"][0][0] not in tokens
        first, second = banned["bad_words_ids"][1]
        full = PROMPT + tokens
        assert not any(a == first and b == second for a, b in zip(full[len(PROMPT) - 1:], full[len(PROMPT):]))
