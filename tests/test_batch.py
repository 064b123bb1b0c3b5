"""generate(list of prompts): rows side by side over one target forward per step. Every row is
token-identical to generate() of its prompt alone (greedy, and sampled with its seed), whatever the
strategy, the architecture, the row lengths, when rows finish, and which slot a row lands in."""
from __future__ import annotations

import pytest
import torch

from conftest import ARCHITECTURES, char_tokenizer, hf_greedy, noisy_copy, rest_datastore, tiny_model
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec.batch import BatchVerifier
from specdec.errors import InputError
from specdec.heads import HeadsLayout, MedusaHeads
from specdec.models import output_vocab_size
from specdec.strategies.auto import Auto
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.strategies.lean_forward import LeanForward
from specdec.strategies.early_exit import EarlyExit
from specdec.strategies.layer_skip import LayerSkip
from specdec.strategies.medusa import Medusa
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.strategies.suffix import Suffix
from specdec.strategies.token_recycling import TokenRecycling
from specdec.strategies.lookahead import Lookahead
from specdec.strategies.rest import Rest
from specdec.verifier import Verifier

PROMPTS = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)\n    x = x + 1",
           "ab", "import os\nimport os\nimport", "while True:\n    pass\n"]
LENGTHS = [20, 7, 30, 12, 25, 9]


def strategy(name: str, target):
    if name == "medusa":
        heads = MedusaHeads(HeadsLayout(3, 1, target.config.hidden_size, output_vocab_size(target)))
        torch.manual_seed(0)
        with torch.no_grad():
            for p in heads.parameters():
                p.add_(0.5 * torch.randn_like(p))
        return Medusa(heads, max_nodes=6, top_k=2)
    return {
        "autoregressive": lambda: Autoregressive(),
        "prompt_lookup": lambda: PromptLookup(min_ngram=1, max_ngram=2),
        "draft_chain": lambda: DraftModel(noisy_copy(target), num_tokens=3),
        "draft_tree": lambda: DraftModel(noisy_copy(target), branching=[2, 2, 1]),
        "draft_adaptive": lambda: DraftModel(noisy_copy(target), num_tokens=3, adaptive=True),
        "draft_per_row": lambda: DraftModel(noisy_copy(target), num_tokens=3, batch_rows=False),
        "eagle": lambda: Eagle(random_drafter(target), max_nodes=6, top_k=2, depth=4),
        "eagle3": lambda: Eagle(random_drafter(target, (0, 1, 2), draft_vocab=list(range(0, 96, 3))), max_nodes=6,
                                top_k=2, depth=4),
        "auto": lambda: Auto(PromptLookup(), DraftModel(noisy_copy(target), num_tokens=3), profile=False),
        "suffix": lambda: Suffix(),
        "early_exit_chain": lambda: EarlyExit(1, num_tokens=3),
        "early_exit_tree": lambda: EarlyExit(1, branching=[2, 2, 1]),
        "layer_skip_chain": lambda: LayerSkip(attention=[0], mlp=[1], num_tokens=3),
        "layer_skip_auto": lambda: LayerSkip(auto=True, every=2, branching=[2, 2, 1]),
        "token_recycling": lambda: TokenRecycling(profile=False),
        "lookahead": lambda: Lookahead(window=3, ngram=3, guesses=2),
        "rest": lambda: Rest(rest_datastore(tuple(PROMPTS)), min_match=1, max_nodes=6),
    }[name]()


STRATEGIES = ["autoregressive", "prompt_lookup", "draft_chain", "draft_tree", "draft_adaptive", "draft_per_row",
              "medusa", "eagle",
              "eagle3", "auto", "suffix", "early_exit_chain", "early_exit_tree", "layer_skip_chain", "layer_skip_auto",
              "token_recycling", "lookahead", "rest"]


def speculator(name: str, arch: str = "llama") -> Speculator:
    target = tiny_model(arch, seed=1, sharpen=4.0)
    return Speculator(target, char_tokenizer(), strategy(name, target))


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_batched_equals_hf_greedy_per_row(name):
    sd = speculator(name)
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, ignore_eos=True, batch_size=3)
    assert len(outs) == len(PROMPTS)
    for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
        assert out.finish_reason == "length" and out.text == sd.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert outs.stats.new_tokens == sum(LENGTHS)
    # fewer batched forwards than the rows' own steps together: rows shared them
    assert outs.stats.target_forwards < sum(out.stats.target_forwards for out in outs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("name", ["prompt_lookup", "draft_tree"])
def test_every_architecture_batched(arch, name):
    """mistral is a sliding-window target (tests/conftest.py): its window applies per row."""
    sd = speculator(name, arch)
    outs = sd.generate(PROMPTS[:4], max_new_tokens=LENGTHS[:4], ignore_eos=True)
    for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)


@pytest.mark.parametrize("name", ["draft_chain", "eagle", "medusa", "prompt_lookup"])
@pytest.mark.parametrize("sampler", ["rejection", "coupled"])
def test_sampled_rows_equal_their_call_alone(name, sampler):
    """A row's random stream is its own seed's: each row equals generate() of its prompt alone with
    that seed (and, coupled, the autoregressive text for the seed)."""
    sd = speculator(name)
    seeds = [11, 12, 13, 14]
    kwargs = dict(temperature=0.9, top_k=30, sampler=sampler, ignore_eos=True)
    outs = sd.generate(PROMPTS[:4], max_new_tokens=LENGTHS[:4], seed=seeds, batch_size=3, **kwargs)
    plain = Speculator(sd.target, sd.tokenizer, "autoregressive")
    for prompt, out, n, seed in zip(PROMPTS, outs, LENGTHS, seeds):
        alone = sd.generate(prompt, max_new_tokens=n, seed=seed, **kwargs)
        assert out.token_ids == alone.token_ids and out.stats.seed == seed
        if sampler == "coupled":
            assert out.token_ids == plain.generate(prompt, max_new_tokens=n, seed=seed, **kwargs).token_ids


def test_rows_finish_on_eos_stop_strings_and_length_at_different_steps():
    sd = speculator("draft_chain")
    ids = sd.tokenizer(PROMPTS[0])["input_ids"]
    eos = hf_greedy(sd.target, ids, 6, eos_token_id=None)[5]        # the row of PROMPTS[0] meets it at step 6
    sd.target.generation_config.eos_token_id = eos
    stops = [None, ["o"], None, [":"], None, ["\n"]]
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, stop=stops, batch_size=2)
    reasons = set()
    for prompt, out, n, stop in zip(PROMPTS, outs, LENGTHS, stops):
        alone = sd.generate(prompt, max_new_tokens=n, stop=stop or [])
        assert (out.token_ids, out.finish_reason, out.text) == (alone.token_ids, alone.finish_reason, alone.text)
        reasons.add(out.finish_reason)
    assert outs[0].finish_reason == "eos" and {"eos", "length"} <= reasons


def test_a_row_with_an_empty_tree_beside_full_ones():
    """Lookup finds nothing in one row (its tree is empty, it pads) while another copies a long run;
    a one-token prompt gives eagle no feature yet (an empty first tree)."""
    sd = speculator("prompt_lookup")
    repeat = "abcdefgh abcdefgh abcdefgh abcd"
    outs = sd.generate([repeat, "xq"], max_new_tokens=[16, 16], ignore_eos=True)
    for prompt, out in zip([repeat, "xq"], outs):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], 16, eos_token_id=None)
    eagle = speculator("eagle")
    outs = eagle.generate([[9], PROMPTS[0]], max_new_tokens=[10, 10], ignore_eos=True)
    assert outs[0].token_ids == hf_greedy(eagle.target, [9], 10, eos_token_id=None)


def test_each_rows_cache_is_its_own_after_ragged_steps():
    """Rows that accept 0 and the most drafted tokens in the same step: each row's output is its
    own, and each row's KV equals a fresh prefill of its own committed tokens."""
    from specdec.tree import CandidateTree
    target = tiny_model("llama", seed=1, sharpen=4.0)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
    for draft, expect in ((target, "all"), (noisy_copy(target, noise=3.0), "none")):
        sd = Speculator(target, None, DraftModel(draft, num_tokens=3))   # the target as its own draft: all kept
        outs = sd.generate(prompts, max_new_tokens=9, ignore_eos=True)
        for prompt, out in zip(prompts, outs):
            assert out.token_ids == hf_greedy(target, prompt, 9, eos_token_id=None)
        accepted = [length for out in outs for length in out.stats.accepted_lengths]
        assert (max(accepted) == 3) if expect == "all" else (min(accepted) == 0)
    # the cache rows themselves, after one step where row 0 keeps nothing and row 1 all three
    batch = BatchVerifier(target, sd.verifier.layout)
    rows = [[5, 6, 7, 8, 9], [10, 11, 12]]
    for row, prompt in enumerate(rows):
        single = sd.verifier.for_call()
        single.prefill(prompt[:-1])
        batch.set_row(row, single.cache.layers, 0, single.prefix_len, 32)
    trees = [CandidateTree.chain(torch.tensor([1, 2, 3])), CandidateTree.chain(torch.tensor([4, 5, 6]))]
    batch.forward([rows[0][-1], rows[1][-1]], trees, None)
    batch.commit(0, [0])
    batch.commit(1, [0, 1, 2, 3])
    for row, tokens in enumerate([rows[0], rows[1] + [4, 5, 6]]):
        fresh = Verifier(target)
        fresh.prefill(tokens)
        assert batch.fills[row] == len(tokens)
        for layer, fresh_layer in zip(batch.cache.layers, fresh.cache.layers):
            torch.testing.assert_close(layer.key_buffer[row, :, :len(tokens)], fresh_layer.keys[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(layer.value_buffer[row, :, :len(tokens)], fresh_layer.values[0], rtol=1e-5,
                                       atol=1e-5)


@pytest.mark.parametrize("name,sampling", [("draft_chain", "greedy"), ("draft_adaptive", "greedy"), ("auto", "greedy"),
                                           ("draft_tree", "greedy"), ("draft_tree", "rejection"),
                                           ("draft_tree", "coupled")])
def test_draft_model_rows_draft_together(name, sampling, monkeypatch):
    """A batch's draft-model chains run in one draft forward per chain position (trees: per level) for
    all rows (plus one for their catch-up), not one per row, and each row drafts what it drafts alone:
    the same tokens and accepted lengths step by step, greedy and sampled with the row's seed (a draft
    cache left wrong by a ragged step, a finished row or a reused slot, or a tree level seeing another
    row's or a sibling's entries, would change its drafts). auto plans with measured times, so only
    the forward count holds there."""
    sd = speculator(name)
    drafter = sd.strategy.drafter if name == "auto" else sd.strategy
    kwargs = dict(ignore_eos=True) if sampling == "greedy" else dict(temperature=0.9, top_k=30, sampler=sampling,
                                                                    ignore_eos=True)
    seeds = list(range(21, 21 + len(PROMPTS)))
    calls = []
    handle = drafter.draft.register_forward_pre_hook(lambda *args: calls.append(1))
    # a row alone runs its draft's layers without the module's forward (draft.lean_forward): counted too
    lean_forward = LeanForward.forward
    monkeypatch.setattr(LeanForward, "forward", lambda self, *args, **kwargs: calls.append(1) or lean_forward(
        self, *args, **kwargs))
    try:
        outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, seed=seeds, batch_size=4, **kwargs)
        batched_calls = len(calls)
        alone = [sd.generate(prompt, max_new_tokens=n, seed=seed, **kwargs)
                 for prompt, n, seed in zip(PROMPTS, LENGTHS, seeds)]
        alone_calls = len(calls) - batched_calls
    finally:
        handle.remove()
    for prompt, out, one, n in zip(PROMPTS, outs, alone, LENGTHS):
        assert out.token_ids == one.token_ids
        if sampling == "greedy":
            assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
        if name != "auto":
            assert out.stats.accepted_lengths == one.stats.accepted_lengths
    longest_chain = (len(drafter.branching) if drafter.branching else
                     drafter.max_tokens if drafter.adaptive else drafter.num_tokens)
    # per batched step: one catch-up forward and longest_chain - 1 chain positions (tree levels) at most;
    # a group of starting prompts adds one (their prompts, fed together)
    assert batched_calls <= longest_chain * outs.stats.target_forwards + len(PROMPTS)
    if name != "auto":        # 4 rows at once: far fewer forwards than the rows' own runs together
        assert 2 * batched_calls < alone_calls, (batched_calls, alone_calls)


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
@pytest.mark.parametrize("sampling", ["greedy", "rejection", "coupled"])
def test_eagle_rows_draft_together(name, sampling):
    """A batch's EAGLE trees are built side by side: one drafter forward per tree level for all rows
    (plus one for their catch-up), and each row drafts what it drafts alone: the same accepted lengths
    step by step, greedy and sampled with the row's seed (a drafter cache left wrong by a ragged step, a
    finished row or a reused slot, or a random draw taken out of turn, would change them)."""
    sd = speculator(name)
    kwargs = dict(ignore_eos=True) if sampling == "greedy" else dict(temperature=0.9, top_k=30, sampler=sampling,
                                                                    ignore_eos=True)
    seeds = list(range(21, 21 + len(PROMPTS)))
    calls = []
    handle = sd.strategy.drafter.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, seed=seeds, batch_size=4, **kwargs)
        batched_calls = len(calls)
        alone = [sd.generate(prompt, max_new_tokens=n, seed=seed, **kwargs)
                 for prompt, n, seed in zip(PROMPTS, LENGTHS, seeds)]
        alone_calls = len(calls) - batched_calls
    finally:
        handle.remove()
    for prompt, out, one, n in zip(PROMPTS, outs, alone, LENGTHS):
        assert out.token_ids == one.token_ids
        assert out.stats.accepted_lengths == one.stats.accepted_lengths
        if sampling == "greedy":
            assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    levels = sd.strategy.depth if sampling != "rejection" else sd.strategy.sampled_depth
    # per batched step: one catch-up forward and a forward per level below the first; a group of
    # starting prompts adds one (their prompts' features, fed together)
    assert batched_calls <= levels * outs.stats.target_forwards + len(PROMPTS)
    assert 2 * batched_calls < alone_calls, (batched_calls, alone_calls)


def test_eagle_per_row_drafting_switch():
    """eagle.batch_rows=false: every row drafts alone (its own cache), with the same outputs."""
    sd = speculator("eagle")
    sd.strategy.batch_rows = False
    outs = sd.generate(PROMPTS[:4], max_new_tokens=LENGTHS[:4], ignore_eos=True, batch_size=4)
    for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    assert sd.strategy.batch_drafter() is None


def test_a_reused_slot_starts_clean():
    """batch_size=1: every prompt runs in slot 0 after the one before; nothing of the previous row
    (KV, lookup index, draft cache) leaks into the next."""
    for name in ("prompt_lookup", "draft_chain", "eagle"):
        sd = speculator(name)
        outs = sd.generate(PROMPTS[:3], max_new_tokens=LENGTHS[:3], ignore_eos=True, batch_size=1)
        for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
            assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)


def test_one_forward_per_step_and_prompts_prefilled_together():
    """Padded rows cost no extra forward: the target runs once per batched step, plus once per
    group of prompts that start together (their prefill, one forward per chunk for the group);
    the batch's KV is allocated once and grown in steps, not per token."""
    from specdec.batch import BatchVerifier, RowLayer
    sd = speculator("draft_chain")
    calls, groups, allocations = [], [], []
    handle = sd.target.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    real_prefill, real_allocate = BatchVerifier.prefill_outputs, RowLayer.allocate

    def prefill(self, prompts, *args):
        groups.append(len(prompts))
        return real_prefill(self, prompts, *args)

    def allocate(self, *args):
        allocations.append(1)
        return real_allocate(self, *args)

    BatchVerifier.prefill_outputs, RowLayer.allocate = prefill, allocate
    try:
        outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, ignore_eos=True, batch_size=4)
    finally:
        BatchVerifier.prefill_outputs, RowLayer.allocate = real_prefill, real_allocate
        handle.remove()
    assert sum(groups) == len(PROMPTS) and groups[0] == 4 and len(groups) < len(PROMPTS)
    assert len(calls) == len(groups) + outs.stats.target_forwards       # prompts shorter than a chunk
    layers = sd.target.config.num_hidden_layers
    assert len(allocations) <= layers * 3 * (1 + len(groups))          # a few per layer per group, not per step
    assert outs.stats.target_forwards < sum(LENGTHS)


def test_a_long_prompt_is_prefilled_in_chunks_with_the_others():
    """prefill_chunk smaller than the prompts: the group's prefill runs chunk by chunk (rows whose
    prompt is done pad), and every row is still identical to HF greedy."""
    sd = speculator("prompt_lookup")
    sd.verifier.prefill_chunk = 4
    prompts = [PROMPTS[2], "ab", PROMPTS[0]]
    outs = sd.generate(prompts, max_new_tokens=10, ignore_eos=True)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], 10, eos_token_id=None)


@pytest.mark.parametrize("prompts, kwargs, phrases", [
    ([], {}, ["prompt is empty", "at least one prompt"]),
    (["def f", ""], {}, ["prompt 1", "empty"]),
    (["def f", "def g"], {"max_new_tokens": [4, 5, 6]}, ["max_new_tokens holds 3 values for 2 prompts"]),
    (["def f", "def g"], {"seed": [1]}, ["seed holds 1 values for 2 prompts"]),
    (["def f", "def g"], {"stop": [["x"], None, ["y"]]}, ["stop holds 3 values"]),
    (["def f", "x" * 600], {"max_new_tokens": 4}, ["prompt 1", "context"]),
    (["def f", "def g"], {"batch_size": 0}, ["batch_size must be an integer >= 1"]),
])
def test_bad_batch_input_names_the_row(prompts, kwargs, phrases):
    sd = speculator("autoregressive")
    with pytest.raises(InputError) as info:
        sd.generate(prompts, **kwargs)
    for phrase in phrases:
        assert phrase in str(info.value)


def test_stream_refuses_a_batch():
    sd = speculator("autoregressive")
    with pytest.raises(InputError, match="stream\\(\\) takes one prompt"):
        sd.stream(["def f", "def g"])


def test_a_tensor_batch_and_a_batch_of_one():
    sd = speculator("prompt_lookup")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    outs = sd.generate(ids, max_new_tokens=6, ignore_eos=True)
    assert [o.token_ids for o in outs] == [hf_greedy(sd.target, row.tolist(), 6, eos_token_id=None) for row in ids]
    one = sd.generate(["def f"], max_new_tokens=5, ignore_eos=True)
    assert len(one) == 1 and one[0].token_ids == sd.generate("def f", max_new_tokens=5, ignore_eos=True).token_ids


def test_auto_prices_trees_at_the_batch_size_it_runs(tmp_path, monkeypatch):
    """In a batch of B rows auto plans with the verify cost of a forward of B rows (measured the
    first time that batch size runs, cached on disk under its own key), and stays lossless."""
    from specdec import costmodel
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = Auto(PromptLookup(), DraftModel(noisy_copy(target), num_tokens=3), profile=True, profile_context=8,
                    max_nodes=4, profile_repeats=1)
    sd = Speculator(target, char_tokenizer(), strategy)
    measured = []
    real = costmodel.measure_verify_costs
    monkeypatch.setattr(costmodel, "measure_verify_costs",
                        lambda *args, **kwargs: measured.append(kwargs.get("batch", args[4] if len(args) > 4 else 1))
                        or real(*args, **kwargs))
    outs = sd.generate(PROMPTS[:3], max_new_tokens=LENGTHS[:3], ignore_eos=True)
    for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
        assert out.token_ids == hf_greedy(target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    assert 4 in measured and 4 in strategy.batch_costs                  # 3 rows: the profile of 4
    assert all(b > 1 for b in measured)                                 # batch 1's was measured at load
    keys = {costmodel.profile_key(target, (0, 1), 8, batch) for batch in (1, 3)}
    assert len(keys) == 2
    # the batched measurement itself: one timing per size, all positive
    profile = costmodel.measure_verify_costs(target, (0, 2), 8, 1, batch=2)
    assert profile.sizes == (0, 2) and all(t > 0 for t in profile.seconds)
