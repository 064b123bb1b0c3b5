"""Stop rules that fire inside an accepted run cut the output exactly where plain generation
stops; streaming joins to generate's text; seeded sampling is reproducible."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from conftest import char_tokenizer, hf_greedy, tiny_model
from specdec import Speculator
from specdec.stopping import StopRules
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from test_greedy_identity import noisy_copy, with_eos_at


ARCH = "gpt_neox"          # its greedy continuation of PROMPT has no special token in N steps
PROMPT = "def f"
N = 24
GAMMA = 6                  # draft = target: runs of GAMMA + 1 tokens
SHAPES = ["chain", "tree"]


@lru_cache(maxsize=None)
def setup():
    model = tiny_model(ARCH, seed=0)
    tok = char_tokenizer()
    prompt_ids = tok(PROMPT)["input_ids"]
    full = hf_greedy(model, prompt_ids, N, eos_token_id=None)
    assert all(t >= 3 for t in full), "precondition: no special tokens in the plain continuation"
    return model, tok, prompt_ids, full


def speculator(shape: str, model=None) -> Speculator:
    base, tok, _, _ = setup()
    model = base if model is None else model
    strategy = DraftModel(model, num_tokens=GAMMA) if shape == "chain" else DraftModel(model, branching=[2, 2, 2, 1, 1, 1])
    return Speculator(model, tok, strategy)


def cut_inside_a_run(stats) -> bool:
    """True when the last verify step produced more tokens than were kept."""
    return sum(a + 1 for a in stats.accepted_lengths) > stats.new_tokens


def mid_run_positions(full: list[int], run: int = GAMMA + 1, start: int = 8) -> list[int]:
    """Positions k >= start of first occurrences that are not the last token of a full run."""
    return [k for k in range(start, len(full) - 1) if full[k] not in full[:k] and k % run != run - 1]


# ---------------------------------------------------------------------- EOS
@pytest.mark.parametrize("shape", SHAPES)
def test_eos_inside_accepted_run(shape):
    base, tok, prompt_ids, full = setup()
    model, at, _ = with_eos_at(base, prompt_ids, at_least=8)
    expected = hf_greedy(model, prompt_ids, N)
    assert expected == full[:at] + [2], "precondition: greedy hits EOS at `at`"
    assert at % (GAMMA + 1) != GAMMA, "precondition: EOS is not the last token of a run"
    out = speculator(shape, model).generate(prompt_ids, max_new_tokens=N)
    assert out.token_ids == expected
    assert out.finish_reason == "eos"
    assert cut_inside_a_run(out.stats)
    assert out.text == tok.decode(expected, skip_special_tokens=True)
    # ignore_eos runs on through the same tokens
    longer = speculator(shape, model).generate(prompt_ids, max_new_tokens=N, ignore_eos=True)
    assert longer.token_ids[: len(expected)] == expected and len(longer.token_ids) == N
    assert longer.finish_reason == "length"


# ---------------------------------------------------------------------- stop token ids
@pytest.mark.parametrize("shape", SHAPES)
def test_stop_token_inside_accepted_run(shape):
    _, _, prompt_ids, full = setup()
    positions = mid_run_positions(full)
    assert positions, "precondition: a fresh token inside a run"
    k = positions[0]
    out = speculator(shape).generate(prompt_ids, max_new_tokens=N, stop_token_ids=[full[k]])
    assert out.token_ids == full[: k + 1]
    assert out.finish_reason == "stop"
    if shape == "chain":
        assert cut_inside_a_run(out.stats)
    # the autoregressive strategy stops at the same place
    plain = Speculator(setup()[0], setup()[1], Autoregressive()).generate(
        prompt_ids, max_new_tokens=N, stop_token_ids=[full[k]])
    assert plain.token_ids == out.token_ids and plain.finish_reason == "stop"


def test_first_of_several_stop_conditions_wins():
    _, _, prompt_ids, full = setup()
    k1, k2 = mid_run_positions(full)[:2]
    out = speculator("chain").generate(prompt_ids, max_new_tokens=N, stop_token_ids=[full[k2], full[k1]])
    assert out.token_ids == full[: k1 + 1]
    out = speculator("chain").generate(prompt_ids, max_new_tokens=k1, stop_token_ids=[full[k1]])
    assert out.token_ids == full[:k1] and out.finish_reason == "length"


# ---------------------------------------------------------------------- stop strings
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("length", [1, 3])
def test_stop_string_inside_accepted_run(shape, length):
    model, tok, prompt_ids, full = setup()
    text = tok.decode(full)
    assert len(text) == len(full)           # one character per token
    # a stop string of `length` characters (tokens) whose first occurrence ends mid-run
    ends = [k for k in range(8, N - 1) if k % (GAMMA + 1) != GAMMA
            and text.find(text[k - length + 1: k + 1]) == k - length + 1]
    assert ends, "precondition: a stop string ending inside a run"
    k = ends[0]
    stop = text[k - length + 1: k + 1]
    hf = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                        max_new_tokens=N, do_sample=False, stop_strings=[stop], tokenizer=tok)
    expected = hf[0, len(prompt_ids):].tolist()
    assert expected == full[: k + 1]
    sd = speculator(shape)
    out = sd.generate(PROMPT, max_new_tokens=N, stop=stop)
    assert out.token_ids == expected
    assert out.finish_reason == "stop"
    assert out.text.endswith(stop) and out.text.count(stop) == 1
    if shape == "chain":
        assert cut_inside_a_run(out.stats)
    assert "".join(sd.stream(PROMPT, max_new_tokens=N, stop=stop)) == out.text
    # a list of stop strings: the earliest completed one wins
    out2 = sd.generate(PROMPT, max_new_tokens=N, stop=[text[N - 3:], stop])
    assert out2.token_ids == expected


def test_stop_rules_string_spanning_tokens_directly():
    """StopRules on its own: a 3-token stop string fires on the token that completes it."""
    tok = char_tokenizer()
    ids = tok("abcXYZdef")["input_ids"]
    rules = StopRules(max_new_tokens=100, stop_strings=("XYZ",), tokenizer=tok)
    assert rules.cut([], ids) == (6, "stop")
    assert rules.cut(ids[:4], ids[4:]) == (2, "stop")          # spans the previous run and this one
    assert rules.cut([], ids[:5]) == (5, None)
    assert StopRules(max_new_tokens=4).cut([1, 2], [3, 4, 5]) == (2, "length")
    assert StopRules(max_new_tokens=9, eos_token_ids=frozenset({4})).cut([], [3, 4, 5]) == (2, "eos")


# ---------------------------------------------------------------------- max_new_tokens
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [1, 2, 10, 13])
def test_max_new_tokens(shape, n):
    _, _, prompt_ids, full = setup()
    out = speculator(shape).generate(prompt_ids, max_new_tokens=n)
    assert out.token_ids == full[:n]
    assert out.finish_reason == "length"
    assert out.stats.new_tokens == n
    assert out.stats.target_forwards < n or n == 1


# ---------------------------------------------------------------------- streaming
@pytest.mark.parametrize("shape", SHAPES)
def test_stream_joins_to_generate_text(shape):
    _, tok, _, full = setup()
    sd = speculator(shape)
    pieces = list(sd.stream(PROMPT, max_new_tokens=N))
    assert len(pieces) > 1                 # it streams, run by run
    assert "".join(pieces) == sd.generate(PROMPT, max_new_tokens=N).text == tok.decode(full)


def test_stream_with_eos_skips_special_text():
    base, tok, prompt_ids, _ = setup()
    model, _, _ = with_eos_at(base, prompt_ids, at_least=8)
    sd = speculator("chain", model)
    out = sd.generate(PROMPT, max_new_tokens=N)
    assert out.finish_reason == "eos" and "<eos>" not in out.text
    assert "".join(sd.stream(PROMPT, max_new_tokens=N)) == out.text


# ---------------------------------------------------------------------- seeded sampling
def sampling_speculator(kind: str) -> Speculator:
    model, tok, _, _ = setup()
    if kind == "autoregressive":
        return Speculator(model, tok, Autoregressive())
    if kind == "chain":
        return Speculator(model, tok, DraftModel(noisy_copy(model), num_tokens=4))
    return Speculator(model, tok, DraftModel(noisy_copy(model), branching=[3, 2, 1]))


@pytest.mark.parametrize("kind", ["autoregressive", "chain", "tree"])
@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.8, top_k=20, top_p=0.9)])
def test_seeded_sampling_is_reproducible(kind, warp):
    sd = sampling_speculator(kind)
    runs = {seed: sd.generate(PROMPT, max_new_tokens=16, seed=seed, ignore_eos=True, **warp).token_ids
            for seed in range(4)}
    again = sampling_speculator(kind).generate(PROMPT, max_new_tokens=16, seed=2, ignore_eos=True, **warp)
    assert again.token_ids == runs[2]
    assert sd.generate(PROMPT, max_new_tokens=16, seed=0, ignore_eos=True, **warp).token_ids == runs[0]
    assert len({tuple(r) for r in runs.values()}) > 1, "different seeds should give different samples"
    assert all(len(r) == 16 for r in runs.values())
