"""lookahead: a hand-traced step (the tree's paths, masks and positions are the lookahead and
verification branches', the window shifts, the pool gains the column n-grams), the window keeping
each cell's position, the config's two spellings and refusals, and exactness through the real loop
(greedy identity on every identity architecture, one sequence and a ragged batch; an oracle window
accepted through the lookahead branch, a junk one changing nothing). The output laws under the
rejection and coupled samplers are in test_law_end_to_end.py and test_coupled.py."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_ragged_batch_greedy_identical, char_tokenizer, hf_greedy, tiny_model
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.errors import ConfigError
from specdec.sampling import SamplingParams, TorchRandom
from specdec.strategies.lookahead import Lookahead, NgramPool, Window, from_config
from specdec.tree import tree_position_ids, tree_visibility, with_pending_root
from specdec.types import DecodeState, StepResult

PROMPT = [5, 17, 33, 9, 41, 60, 70, 5, 17, 33]
N = 24


def state_of(tokens, max_depth=16) -> DecodeState:
    return DecodeState(token_ids=list(tokens), prompt_len=len(tokens), sampling=SamplingParams(0.0),
                       rng=TorchRandom(torch.Generator()), max_depth=max_depth)


def path_of(tree, node: int) -> list[int]:
    """Node indices from the root down to `node`."""
    path = [node]
    while tree.parents[path[-1]] != -1:
        path.append(tree.parents[path[-1]])
    return path[::-1]


# ---------------------------------------------------------------------- a hand-traced step
def hand_strategy() -> Lookahead:
    """W = 3 columns, N = 3 (two levels), G = 2, pending token 7. The window, every cell learned:
        level 0:  [7]  11  12        cell (l, i) guesses position base + l + i
        level 1:   20  21  22
    The pool holds two n-grams after 7: (30, 31), then (11, 40) (its first token is cell (0, 1)'s)."""
    strategy = Lookahead(window=3, ngram=3, guesses=2)
    strategy.reset(state_of([1, 2, 7]))
    strategy.window.tokens = [[7, 11, 12], [20, 21, 22]]
    strategy.window.learned = [[True] * 3, [True] * 3]
    strategy.pool.add(7, (30, 31))
    strategy.pool.add(7, (11, 40))
    return strategy


def test_the_tree_holds_both_branches_with_the_papers_masks_and_positions():
    strategy = hand_strategy()
    tree = strategy.propose(state_of([1, 2, 7]))
    tokens = tree.tokens.tolist()
    # column paths 20 | 11 21 | 11 12 22, then the guesses (11, 40) (11 shared with cell (0, 1)) and (30, 31)
    assert tokens == [20, 11, 21, 12, 22, 40, 30, 31]
    assert tree.parents == (-1, -1, 1, 1, 3, 1, -1, 6)
    cells = {(1, 0): 0, (0, 1): 1, (1, 1): 2, (0, 2): 3, (1, 2): 4}       # cell -> node, read off the trace
    window = [[7, 11, 12], [20, 21, 22]]
    prefix = 10                                                             # committed entries in the cache
    parents = with_pending_root(tree.parents)
    sees = tree_visibility(parents, prefix)                                # [1 + N, prefix + 1 + N]
    positions = tree_position_ids(parents, prefix)[0].tolist()              # [1 + N]
    cell_of_row = {0: (0, 0)} | {node + 1: cell for cell, node in cells.items()}
    for (level, col), node in cells.items():
        row = node + 1
        assert tokens[node] == window[level][col]
        assert positions[row] == prefix + level + col                       # base + l + i (base: the pending token's)
        seen_cells = {cell_of_row.get(r - prefix, ("guess row", r - prefix))
                      for r in range(prefix, prefix + len(parents)) if sees[row, r]}
        # the paper's mask: the first level up to its column, and its own column down to itself
        expected = {(0, c) for c in range(col + 1)} | {(l, col) for l in range(1, level + 1)}
        assert seen_cells == expected, (level, col)
        assert bool(sees[row, :prefix].all())                               # and the whole committed context
    for guess in ((30, 31), (11, 40)):                                      # the verification branch
        leaf = next(i for i in range(tree.num_nodes) if [tokens[n] for n in path_of(tree, i)] == list(guess))
        assert [positions[n + 1] for n in path_of(tree, leaf)] == [prefix + 1, prefix + 2]
        seen = {r - prefix for r in range(prefix, prefix + len(parents)) if sees[leaf + 1, r]}
        assert seen == {0} | {n + 1 for n in path_of(tree, leaf)}          # the pending token and its own path
    assert strategy.drafted.last_rows == (1, 3, 5)                          # rows of cells (1, 0), (1, 1), (1, 2)
    assert strategy.drafted.guess_nodes == {1, 5, 6, 7}                     # the verification branch's nodes


def test_after_the_step_the_window_shifts_and_the_pool_gains_the_columns_ngrams():
    """The target's argmax after the last level's cells is 50, 51, 52; node 1 (token 11) is accepted
    and the target's token after it is 60: two tokens committed, base moves two positions."""
    strategy = hand_strategy()
    tree = strategy.propose(state_of([1, 2, 7]))
    argmax = [90 + row for row in range(1 + tree.num_nodes)]
    argmax[1], argmax[3], argmax[5] = 50, 51, 52
    top_ids = torch.tensor(argmax)[:, None]                                  # [1 + N, 1]
    input_ids = torch.tensor([7] + tree.tokens.tolist())
    strategy.refill = lambda: -1                                            # refills show as -1
    strategy.observe(state_of([1, 2, 7, 11, 60]), StepResult(tree, (1,), 60, 3, None, top_ids, input_ids))
    # each column: its cells top to bottom then the argmax after them, keyed by the first (the pending
    # token for column 0); G = 2 keeps the latest two per first token
    assert strategy.pool.guesses(7) == [(20, 50), (11, 40)]
    assert strategy.pool.guesses(11) == [(21, 51)]
    assert strategy.pool.guesses(12) == [(22, 52)]
    # levels up one (the argmax is the new last level), columns one left: every cell keeps its position
    assert strategy.window.tokens == [[21, 22, -1], [51, 52, -1]]
    assert strategy.window.learned == [[True, True, False], [True, True, False]]


def test_a_column_holding_a_refill_gives_no_ngram():
    window = Window(3, 2, lambda: 0)
    window.tokens = [[7, 11, 12], [20, 21, 22]]
    window.learned = [[True, True, False], [True, True, True]]
    assert [first for first, _ in window.ngrams(7, [50, 51, 52])] == [7, 11]      # column 2 starts with a refill
    assert [first for first, _ in window.ngrams(7, [50, None, 52])] == [7]        # column 1's last cell not read


@pytest.mark.parametrize("committed", [1, 2, 4])
def test_every_cell_keeps_guessing_its_position(committed):
    """Cell (l, i) guesses position base + l + i. After `committed` tokens, with the target's new guesses
    (they guess base + L + i, one past the last level) or without any, every guess that stays in the
    window sits where its position now is; the rest of the window is refilled."""
    width, levels, base = 4, 3, 100

    def guesses(window, at):
        return {(at + level + col): window.tokens[level][col] for level in range(levels) for col in range(width)
                if window.learned[level][col] and (level, col) != (0, 0)}

    for with_outputs in (True, False):
        window = Window(width, levels, lambda: -1)
        # token = the position it guesses, so a misplaced cell shows
        window.tokens = [[base + level + col for col in range(width)] for level in range(levels)]
        window.learned = [[True] * width for _ in range(levels)]
        outputs = [base + levels + col for col in range(width)] if with_outputs else None
        window.advance(committed, outputs, lambda: -1)
        moved = base + committed
        for position, token in guesses(window, moved).items():
            assert token == position
        for level in range(levels):
            for col in range(width):
                assert window.learned[level][col] == (window.tokens[level][col] != -1)
        kept = sum(map(sum, window.learned))          # columns moved out are gone, the others all kept
        assert kept == levels * max(width - (committed - 1 if with_outputs else committed), 0)


def test_the_pool_keeps_the_latest_g_per_first_token():
    pool = NgramPool(2)
    for rest in ((1, 2), (3, 4), (1, 2), (5, 6)):
        pool.add(9, rest)
    assert pool.guesses(9) == [(5, 6), (1, 2)]                  # (1, 2) seen again is newer than (3, 4)
    pool.add_ngrams_of([4, 5, 6, 4, 5, 7], 3)
    assert pool.guesses(4) == [(5, 7), (5, 6)] and pool.guesses(5) == [(6, 4)] and pool.guesses(7) == []


# ---------------------------------------------------------------------- config and refusals
def test_config_names_ours_and_tensorrt_llms():
    cfg = load_spec_config("lookahead")
    s = from_config(cfg, None, None, "cpu", torch.float32)
    assert (s.window_size, s.ngram, s.guesses) == (5, 4, 5)
    theirs = load_spec_config("lookahead", {"lookahead.max_window_size": 7, "lookahead.max_ngram_size": 3,
                                            "lookahead.max_verification_set_size": 2})
    s = from_config(theirs, None, None, "cpu", torch.float32)
    assert (s.window_size, s.ngram, s.guesses) == (7, 3, 2) and s.max_nodes == (7 + 2) * 2 - 1
    both = load_spec_config("lookahead", {"lookahead.window": 6, "lookahead.max_window_size": 6})
    assert from_config(both, None, None, "cpu", torch.float32).window_size == 6
    clash = load_spec_config("lookahead", {"lookahead.window": 6, "lookahead.max_window_size": 7})
    with pytest.raises(ConfigError, match=r"lookahead.window = 6 and lookahead.max_window_size = 7 disagree"):
        from_config(clash, None, None, "cpu", torch.float32)


@pytest.mark.parametrize("key, value", [("window", 0), ("ngram", 1), ("guesses", 0), ("max_window_size", 0),
                                        ("max_ngram_size", 1), ("max_verification_set_size", -1)])
def test_bad_sizes_are_refused_by_the_config(key, value):
    with pytest.raises(ConfigError, match=f"lookahead.{key}"):
        load_spec_config("lookahead", {f"lookahead.{key}": value})


@pytest.mark.parametrize("key, value", [("window", 0), ("ngram", 1), ("guesses", 0), ("window", 2.5), ("ngram", True)])
def test_bad_sizes_are_refused_by_the_strategy(key, value):
    with pytest.raises(ConfigError, match=f"lookahead.{key}"):
        Lookahead(**{key: value})


# ---------------------------------------------------------------------- exactness through the loop
@pytest.mark.parametrize("sizes", [dict(window=3, ngram=2, guesses=2), dict(window=4, ngram=4, guesses=3)])
def test_greedy_identity(arch, sizes):
    target = tiny_model(arch, seed=0)
    strategy = Lookahead(**sizes)
    sd = Speculator(target, None, strategy)
    kept = 0
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
        assert out.stats.proposed_nodes > sum(out.stats.accepted_lengths)     # nodes were rejected
        kept += sum(out.stats.accepted_lengths)
    assert kept > 0                                                            # and kept


def test_greedy_identity_ragged_batch(arch):
    target = tiny_model(arch, seed=1, sharpen=4.0)
    strategy = Lookahead(window=3, ngram=3, guesses=3, pool_from_context=True)
    assert_ragged_batch_greedy_identical(Speculator(target, char_tokenizer(), strategy))


class Seeded(Lookahead):
    """Lookahead whose first window holds `first_level` on its first level (the rest as it starts)."""

    def __init__(self, first_level, **sizes):
        super().__init__(**sizes)
        self.first_level = first_level

    def reset(self, state):
        super().reset(state)
        self.window.tokens[0][1:] = list(self.first_level)


def test_a_lookahead_node_the_target_agrees_with_is_accepted_and_junk_changes_nothing():
    """The first level is a chain below the pending token: holding the target's own continuation, the
    first step keeps all of it (no pool yet: the lookahead branch alone); holding junk, nothing of it.
    The text is the target's either way."""
    target = tiny_model("llama", seed=1, sharpen=4.0)
    expected = hf_greedy(target, PROMPT, N, eos_token_id=None)
    oracle = Seeded(expected[:3], window=4, ngram=3, guesses=2)
    out = Speculator(target, None, oracle).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == expected and out.stats.accepted_lengths[0] >= 3
    junk_token = next(t for t in range(50) if t != expected[0])
    junk = Seeded([junk_token] * 3, window=4, ngram=3, guesses=2)
    junk.refill = lambda: junk_token                                      # every refill junk too
    out = Speculator(target, None, junk).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == expected and out.stats.accepted_lengths[0] == 0


def test_the_depth_budget_cuts_the_tree():
    """With a budget of 2 levels no path is deeper, and the columns cut above their last level are read
    as unread (no n-gram, a refill in the new level)."""
    strategy = Lookahead(window=4, ngram=4, guesses=2)
    strategy.reset(state_of(PROMPT))
    tree = strategy.propose(state_of(PROMPT, max_depth=2))
    assert max(tree.depths()) == 1
    assert strategy.drafted.last_rows[0] is not None and strategy.drafted.last_rows[1:] == (None,) * 3
    assert strategy.propose(state_of(PROMPT, max_depth=0)).num_nodes == 0


# ---------------------------------------------------------------------- inside auto
def auto_with_lookahead(target, **overrides):
    from specdec.strategies.auto import from_config as auto_from_config
    cfg = load_spec_config("auto", {"auto.drafter": "lookahead", "auto.profile": False, "lookahead.window": 3,
                                    "lookahead.ngram": 3, "lookahead.guesses": 2, **overrides})
    return auto_from_config(cfg, target, None, target.device, target.dtype)


def test_auto_with_lookahead_verifies_its_tree_whole_and_is_greedy_identical():
    """auto.drafter = lookahead: when auto calls it, the whole window and guesses are verified (never
    pruned: the window learns from every node's row), merged with prompt lookup's paths; the text is
    the target's, and the window learns from the steps that called it."""
    from specdec.costmodel import CostProfile
    from specdec.strategies.auto import Auto
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = auto_with_lookahead(target, **{"auto.explore_every": 1})
    assert isinstance(strategy, Auto) and isinstance(strategy.drafter, Lookahead) and strategy.top_k_ids == 1
    strategy.costs = CostProfile((0, 64), (1.0, 20.0), 0)                 # nodes the planner would prune alone
    rows_read = []                          # (nodes drafted, rows of the forward the drafter then read)
    drafter = strategy.drafter
    real_propose, real_observe = drafter.propose, drafter.observe

    def propose(state):
        drafter.last_tree = real_propose(state)
        return drafter.last_tree

    def observe(state, result):
        if result.tree is getattr(drafter, "last_tree", None) and result.tree.num_nodes:
            rows_read.append((result.tree.num_nodes, result.top_ids.shape[0]))
        real_observe(state, result)
    drafter.propose, drafter.observe = propose, observe
    sd = Speculator(target, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
    assert strategy.neural_calls > 0 and rows_read
    assert all(rows == 1 + nodes for nodes, rows in rows_read)             # every node verified, its row read
    assert any(strategy.drafter.window.learned[level][col] for level in range(2) for col in range(3))


def test_auto_prices_lookahead_out_where_its_rows_cost_what_they_bring():
    """Where every extra row costs as much as a plain step, auto stops calling lookahead after its looks."""
    from specdec.costmodel import CostProfile
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = auto_with_lookahead(target)
    strategy.costs = CostProfile((0, 64), (1.0, 65.0), 0)                 # each node: one more forward
    strategy.adapt_costs = False
    strategy.draft_cost_s = 0.0
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, 48, eos_token_id=None)
    assert 0 < strategy.neural_calls <= 48 // 8                            # a first call, then looks far apart


# ---------------------------------------------------------------------- specdec check
def test_specdec_check_passes_through_lookahead_and_fails_when_acceptance_is_broken(tmp_path, capsys):
    """`specdec check lookahead ...`: identity and the sampling law hold; with an acceptance that keeps
    every first child (the window's junk included), the check fails."""
    from test_check import check_passes_and_fails_when_acceptance_is_broken
    tiny_model("llama", seed=0, sharpen=4.0).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    argv = ["check", "lookahead", f"target.path={tmp_path}", "device=cpu", "dtype=float32", "lookahead.window=3",
            "lookahead.ngram=3", "--prompt", "abcabcabcab", "--max-new-tokens", "12", "--runs", "60", "--no-speed"]
    check_passes_and_fails_when_acceptance_is_broken(argv, capsys)
