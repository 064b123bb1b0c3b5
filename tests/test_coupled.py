"""The coupled sampler (generation.sampler: coupled): same prompt, seed and sampling settings, same
text, whatever strategy drafts - token for token what `autoregressive` samples - and the output
law is still the target's own.

* the noise: a pure function of (seed, position, token), standard Gumbel, never on filtered tokens;
* identity: every strategy (draft model chain and tree, medusa dynamic / conditioned / static
  trees with fresh heads, prompt lookup) reproduces autoregressive's coupled output on five
  architectures, with steps where all, none and part of the tree is accepted (each asserted to
  occur), while under the rejection sampler the same seeds give other texts (control);
* the law: over many seeds the coupled output's distribution equals the exact enumeration of the
  target's (temperature / top-k / top-p) law on a tiny vocabulary (chi-square and TV), and a
  sampler that reuses one noise vector across positions fails the same test.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from functools import lru_cache

import pytest
import torch

from conftest import hf_greedy, tiny_model
from test_greedy_identity import contrarian_copy, noisy_copy
from test_medusa import fresh_heads, prompt_ids
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.coupled import (GumbelNoise, coupled_argmax, coupled_proposals, gumbel, gumbel_from_keys,
                             position_key, tree_row_positions, uniforms)
from specdec.errors import ConfigError, InputError
from specdec.sampling import SamplingParams, warp_logits
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.medusa import Medusa
from specdec.strategies.prompt_lookup import PromptLookup

N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70]
TEMPERATURE = 0.8
STATIC_CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


# ---------------------------------------------------------------------- helpers
class Recorder:
    """Wraps a strategy and sorts each verify step by how much of its tree was accepted:
    'all' (the accepted path ends at a leaf), 'none' (a tree, nothing accepted), 'partial'
    (stopped above a leaf) or 'empty' (no tree)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.name = strategy.name
        self.needs_hidden_states = strategy.needs_hidden_states
        self.feature_layers = getattr(strategy, "feature_layers", None)
        self.top_k_ids = getattr(strategy, "top_k_ids", 0)
        self.kinds: Counter = Counter()

    def bind(self, target, tokenizer):
        self.strategy.bind(target, tokenizer)

    def reset(self, state):
        self.strategy.reset(state)

    def propose(self, state):
        return self.strategy.propose(state)

    def observe(self, state, result):
        tree = result.tree
        if tree.num_nodes == 0:
            kind = "empty"
        elif not result.accepted:
            kind = "none"
        else:
            kind = "partial" if tree.children(result.accepted[-1]) else "all"
        self.kinds[kind] += 1
        self.strategy.observe(state, result)


def run(target, strategy, prompt, seed, sampler="coupled", n=N, **warp):
    """(new tokens, Counter of step kinds) of one seeded generation."""
    recorder = Recorder(strategy)
    temperature = warp.pop("temperature", TEMPERATURE)
    out = Speculator(target, None, recorder).generate(prompt, max_new_tokens=n, temperature=temperature, seed=seed,
                                                      ignore_eos=True, sampler=sampler, **warp)
    return out.token_ids, recorder.kinds


def autoregressive(target, prompt, seed, sampler="coupled", n=N, **warp):
    return run(target, Autoregressive(), prompt, seed, sampler, n, **warp)[0]


@lru_cache(maxsize=None)
def target_of(arch: str):
    """Peaked enough that the text depends on the model, not only on the noise."""
    return tiny_model(arch, seed=0, sharpen=4.0)


def with_output_bias(model, token: int, bias: float, keep_weights: bool = True):
    """A copy whose output layer gets a bias towards `token` (its weights zeroed unless
    keep_weights): a target whose text repeats `token` often, or ignores its context."""
    import copy
    model = copy.deepcopy(model)
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.weight.shape[1], old.weight.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight if keep_weights else torch.zeros_like(old.weight))
        head.bias.zero_()
        head.bias[token] = bias
    model.set_output_embeddings(head)
    model.config.tie_word_embeddings = False
    return model


# ---------------------------------------------------------------------- the noise
def test_noise_is_a_pure_function_of_seed_position_and_token():
    rows = gumbel(7, [3, 11, 12], 50)                                           # [3, 50]
    torch.manual_seed(123)
    torch.rand(1000)                                 # global RNG state must not matter
    assert torch.equal(gumbel(7, [11], 50)[0], rows[1])
    assert torch.equal(gumbel(7, [12, 3], 50), rows[[2, 0]])
    assert torch.equal(gumbel(7, [3], 20)[0], rows[0, :20])                     # token x: same at any width
    assert not torch.equal(gumbel(8, [3], 50)[0], rows[0])                      # another seed
    assert not torch.equal(rows[1], rows[2])                                    # another position
    assert torch.equal(gumbel_from_keys([position_key(7, 12)], 50)[0], rows[2])
    noise = GumbelNoise(7, SamplingParams(temperature=1.0), 50)
    first = noise([5, 6])
    assert torch.equal(noise([6, 7, 6])[[0, 2]], first[[1, 1]])                  # cached rows are the same rows
    assert torch.equal(noise([7])[0], gumbel(7, [7], 50)[0])


def test_noise_is_standard_gumbel():
    u = uniforms(0, range(100), 4096)                                           # [100, 4096]
    assert 0 < u.min() and u.max() < 1
    sorted_u = u.flatten().sort().values
    ecdf = torch.arange(1, sorted_u.numel() + 1, dtype=torch.float64) / sorted_u.numel()
    assert (ecdf - sorted_u).abs().max() < 0.003                                # Kolmogorov-Smirnov
    g = gumbel(0, range(100), 4096).double()
    assert abs(g.mean().item() - 0.5772156649) < 0.01                           # Euler-Mascheroni
    assert abs(g.var().item() - math.pi ** 2 / 6) < 0.03
    # neighbouring tokens and positions are uncorrelated
    assert abs(torch.corrcoef(torch.stack([g[:, :-1].flatten(), g[:, 1:].flatten()]))[0, 1]) < 0.01
    assert abs(torch.corrcoef(torch.stack([g[:-1].flatten(), g[1:].flatten()]))[0, 1]) < 0.01


def test_filtered_tokens_are_never_chosen_nor_proposed():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))     # [rows, V]
    sampling = SamplingParams(temperature=1.0, top_k=3)
    noise = GumbelNoise(1, sampling, 40)
    allowed = logits.topk(3, dim=-1).indices                                    # [rows, 3]
    for seed in range(50):
        noise = GumbelNoise(seed, sampling, 40)
        chosen = coupled_argmax(logits, range(10, 16), noise)                   # [rows]
        assert all(chosen[r] in allowed[r] for r in range(6))
        proposed = coupled_proposals(logits, range(10, 16), noise, k=8)          # [rows, <= 3]
        assert proposed.shape == (6, 3)
        assert all(set(proposed[r].tolist()) == set(allowed[r].tolist()) for r in range(6))
        assert torch.equal(proposed[:, 0], chosen)                               # best proposal = own sample


def test_tree_row_positions():
    # 3 committed tokens (positions 0..2, the last pending): row 0 predicts 3, a depth-d node's row d + 4
    assert tree_row_positions([0, 0, 1, 2], 3) == [3, 4, 4, 5, 6]


# ---------------------------------------------------------------------- identity
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("case", ["all", "none", "partial"])
def test_draft_model_reproduces_autoregressive(arch, shape, case):
    target = target_of(arch)
    warp = {"top_k": 6} if case == "none" else {}
    draft = {"all": target, "none": contrarian_copy(target), "partial": noisy_copy(target, noise=1.0)}[case]
    strategy = DraftModel(draft, num_tokens=4) if shape == "chain" else DraftModel(draft, branching=[2, 2, 1])
    kinds = Counter()
    for seed in (0, 1):
        tokens, step_kinds = run(target, strategy, PROMPT, seed, **warp)
        assert tokens == autoregressive(target, PROMPT, seed, **warp), f"seed {seed}"
        kinds += step_kinds
    if case == "all":          # the draft is the target: its coupled guess is always the target's token
        assert set(kinds) == {"all"}
    elif case == "none":       # the draft's top-6 is the target's bottom-6, which top_k=6 filters out
        assert set(kinds) == {"none"}
    else:
        assert kinds["partial"] > 0, kinds


@pytest.mark.parametrize("tree,token_conditioned", [("dynamic", False), ("dynamic", True), ("static", False)])
def test_medusa_reproduces_autoregressive(arch, tree, token_conditioned):
    target = target_of(arch)
    heads = fresh_heads(target, noise=0.5, token_conditioned=token_conditioned)
    medusa = Medusa(heads, tree=tree, choices=STATIC_CHOICES if tree == "static" else None, max_nodes=8, top_k=3)
    kinds = Counter()
    for seed in (0, 1):
        prompt = prompt_ids(seed)
        tokens, step_kinds = run(target, medusa, prompt, seed)
        assert tokens == autoregressive(target, prompt, seed)
        kinds += step_kinds
    assert kinds["none"] > 0 and kinds["partial"] > 0, kinds


def test_medusa_heads_equal_to_the_target_accept_everything(arch):
    """A target that reads nothing but its output bias: fresh heads on its lm_head have exactly the
    target's logits, so with the same noise they guess each position's token right - and the text
    is still random (many tokens), not one repeated argmax."""
    target = with_output_bias(tiny_model(arch, seed=0), token=7, bias=1.0, keep_weights=False)
    medusa = Medusa(fresh_heads(target, num_heads=3), max_nodes=6, top_k=2)
    tokens, kinds = run(target, medusa, prompt_ids(5), seed=4, n=25)
    assert tokens == autoregressive(target, prompt_ids(5), seed=4, n=25)
    assert set(kinds) == {"all"}
    assert len(set(tokens)) > 5


def test_eagle_reproduces_autoregressive(arch):
    """The eagle drafter ranks its children by its logits plus the target's noise there: any tree it
    builds gives autoregressive's coupled text; an untrained drafter is partly right, an echo one
    (guessing what the target said one position earlier) on a target leaning to token 7 often."""
    from eagle_helpers import echo_drafter, random_drafter
    from specdec.strategies.eagle import Eagle
    leaning = with_output_bias(target_of(arch), token=7, bias=3.0)
    kinds = Counter()
    reduced = random_drafter(target_of(arch), (0, 1, 2), draft_vocab=list(range(0, 96, 3)))   # EAGLE-3, 32 tokens
    for target, drafter in ((target_of(arch), random_drafter(target_of(arch))), (leaning, echo_drafter(leaning)),
                            (target_of(arch), reduced)):
        for seed in (0, 1):
            prompt = prompt_ids(seed)
            tokens, step_kinds = run(target, Eagle(drafter, max_nodes=8, top_k=3, depth=4), prompt, seed)
            assert tokens == autoregressive(target, prompt, seed)
            kinds += step_kinds
    assert kinds["none"] > 0 and kinds["partial"] + kinds["all"] > 0, kinds


def test_eagle_with_the_targets_logits_accepts_everything(arch):
    """A target that reads nothing but its output bias: any drafter read through its lm_head has
    exactly its logits, so with the same noise eagle guesses every position right (an independent
    draw would not), and the text is still random."""
    from eagle_helpers import random_drafter
    from specdec.strategies.eagle import Eagle
    target = with_output_bias(tiny_model(arch, seed=0), token=7, bias=1.0, keep_weights=False)
    eagle = Eagle(random_drafter(target), max_nodes=6, top_k=2, depth=3)
    tokens, kinds = run(target, eagle, prompt_ids(5), seed=4, n=25)
    assert tokens == autoregressive(target, prompt_ids(5), seed=4, n=25)
    assert set(kinds) == {"all"}
    assert len(set(tokens)) > 5


def test_prompt_lookup_reproduces_autoregressive(arch):
    """A target biased towards token 7 repeats itself; lookups of its own text are then accepted
    in full, in part or not at all. (GPT-2's tiny model needs less bias to stop missing.)"""
    target = with_output_bias(target_of(arch), token=7, bias=3.0 if arch == "gpt2" else 5.0)
    kinds = Counter()
    for seed in (0, 1, 2):
        strategy = PromptLookup(min_ngram=1, max_ngram=2, num_tokens=3)
        tokens, step_kinds = run(target, strategy, PROMPT, seed, n=32)
        assert tokens == autoregressive(target, PROMPT, seed, n=32)
        kinds += step_kinds
    assert kinds["all"] > 0 and kinds["none"] > 0 and kinds["partial"] > 0, kinds


def test_rejection_sampler_does_not_reproduce_autoregressive():
    """Control: the identity above is the coupled sampler's doing. Under rejection sampling the
    same seeds give texts that differ between strategies (each still of the target's law)."""
    target = target_of("llama")
    draft = DraftModel(noisy_copy(target, noise=1.0), num_tokens=4)
    differs = [run(target, draft, PROMPT, seed, sampler="rejection")[0]
               != autoregressive(target, PROMPT, seed, sampler="rejection") for seed in range(4)]
    assert any(differs)


def test_coupled_is_seeded_and_temperature_zero_stays_greedy():
    target = target_of("llama")
    first = autoregressive(target, PROMPT, seed=0)
    assert autoregressive(target, PROMPT, seed=0) == first
    assert autoregressive(target, PROMPT, seed=1) != first
    assert autoregressive(target, PROMPT, seed=None) != autoregressive(target, PROMPT, seed=None)
    greedy = run(target, Autoregressive(), PROMPT, seed=0, temperature=0.0)[0]
    assert greedy == hf_greedy(target, PROMPT, N, eos_token_id=None)


def test_sampler_setting_reaches_generate():
    target = target_of("gpt2")
    with pytest.raises(ConfigError, match="coupled"):
        load_spec_config("autoregressive", {"generation.sampler": "coupeld"})
    with pytest.raises(InputError, match="one of rejection, coupled"):
        Speculator(target, None, Autoregressive()).generate(PROMPT, max_new_tokens=4, sampler="gumbel")
    cfg = load_spec_config("autoregressive", {"generation.sampler": "coupled"})
    from_config = Speculator(target, None, Autoregressive(), config=cfg)
    out = from_config.generate(PROMPT, max_new_tokens=N, temperature=TEMPERATURE, seed=3, ignore_eos=True)
    assert out.token_ids == autoregressive(target, PROMPT, seed=3)
    overridden = from_config.generate(PROMPT, max_new_tokens=N, temperature=TEMPERATURE, seed=3, ignore_eos=True,
                                      sampler="rejection")
    assert overridden.token_ids == autoregressive(target, PROMPT, seed=3, sampler="rejection")


# ---------------------------------------------------------------------- the law
LAW_VOCAB = 8
LAW_PROMPT = [3, 5, 4]
LAW_SEEDS = 20000


@lru_cache(maxsize=None)
def law_model():
    return tiny_model("llama", seed=3, vocab=LAW_VOCAB, sharpen=3.0)


@lru_cache(maxsize=None)
def logit_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(first [V], second [V, V]): the target's logits for token 1, and for token 2 after each token 1."""
    model = law_model()
    with torch.no_grad():
        first = model(torch.tensor([LAW_PROMPT])).logits[0, -1]
        contexts = torch.tensor([LAW_PROMPT + [x] for x in range(LAW_VOCAB)])
        second = model(contexts).logits[:, -1]
    return first.float(), second.float()


def exact_law(sampling: SamplingParams) -> dict[tuple[int, int], float]:
    first, second = logit_tables()
    p1 = torch.softmax(warp_logits(first, sampling), -1).double()                # [V]
    p2 = torch.softmax(warp_logits(second, sampling), -1).double()               # [V, V]
    return {(a, b): (p1[a] * p2[a, b]).item() for a, b in itertools.product(range(LAW_VOCAB), repeat=2)}


def coupled_counts(sampling: SamplingParams, seeds, reuse_noise: bool = False) -> Counter:
    """The coupled autoregressive sampler's first two tokens for many seeds at once, from the
    logit tables and the library's own noise; reuse_noise: position 2 reuses position 1's noise
    (the negative control)."""
    first, second = logit_tables()
    at = len(LAW_PROMPT)
    g1 = gumbel_from_keys([position_key(s, at) for s in seeds], LAW_VOCAB)          # [S, V]
    g2 = g1 if reuse_noise else gumbel_from_keys([position_key(s, at + 1) for s in seeds], LAW_VOCAB)
    x1 = (warp_logits(first, sampling)[None] + g1).argmax(-1)                         # [S]
    x2 = (warp_logits(second, sampling)[x1] + g2).argmax(-1)                          # [S]
    return Counter(zip(x1.tolist(), x2.tolist()))


def chi_square(counts: Counter, law: dict, total: int) -> tuple[float, float]:
    """(statistic, critical value at p = 1e-6) of Pearson's test, cells of expected count < 5 pooled;
    the critical value by the Wilson-Hilferty approximation."""
    stat, pooled_expected, pooled_observed, cells = 0.0, 0.0, 0, 0
    for cell, prob in law.items():
        expected = prob * total
        if expected < 5:
            pooled_expected += expected
            pooled_observed += counts.get(cell, 0)
            continue
        stat += (counts.get(cell, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_expected > 0:
        stat += (pooled_observed - pooled_expected) ** 2 / max(pooled_expected, 1e-12)
        cells += 1
    df = cells - 1
    z = 4.75                                                                       # one-sided p = 1e-6
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


def total_variation(counts: Counter, law: dict, total: int) -> float:
    return 0.5 * sum(abs(counts.get(cell, 0) / total - prob) for cell, prob in law.items())


WARPS = {"T=0.8": SamplingParams(0.8), "T=1.5 top_k=5": SamplingParams(1.5, top_k=5),
         "T=1 top_p=0.7": SamplingParams(1.0, top_p=0.7)}


@pytest.mark.parametrize("warp", list(WARPS))
def test_coupled_output_has_the_target_law(warp):
    sampling = WARPS[warp]
    law = exact_law(sampling)
    counts = coupled_counts(sampling, range(LAW_SEEDS))
    stat, critical = chi_square(counts, law, LAW_SEEDS)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    assert total_variation(counts, law, LAW_SEEDS) < 0.03
    assert all(law[cell] > 0 for cell in counts), "a filtered-out sequence was sampled"


@pytest.mark.parametrize("warp", list(WARPS))
def test_reusing_noise_across_positions_fails_the_law(warp):
    sampling = WARPS[warp]
    law = exact_law(sampling)
    counts = coupled_counts(sampling, range(LAW_SEEDS), reuse_noise=True)
    stat, critical = chi_square(counts, law, LAW_SEEDS)
    assert stat > 2 * critical, f"the law test must catch noise reused across positions ({stat:.1f})"


def test_law_simulation_is_what_generate_does():
    """The seeds-at-once simulation above is the shipped loop: generate(sampler='coupled') gives the
    same two tokens for each seed."""
    sampling = WARPS["T=1.5 top_k=5"]
    seeds = range(40)
    sd = Speculator(law_model(), None, Autoregressive())
    for seed in seeds:
        out = sd.generate(LAW_PROMPT, max_new_tokens=2, temperature=1.5, top_k=5, seed=seed, ignore_eos=True,
                          sampler="coupled")
        assert coupled_counts(sampling, [seed]) == Counter([tuple(out.token_ids)]), f"seed {seed}"


# ---------------------------------------------------------------------- the benchmark rows
@pytest.mark.slow
def test_samplers_bench_checks_coupled_identity(tmp_path):
    """`specdec bench samplers` on tiny models (those of test_bench): every coupled row's sampled
    text is compared with the coupled autoregressive row's, and is the same. (~40 s: slow.)"""
    import json
    from conftest import save_bench_family
    from specdec.benchmarks.run import main
    save_bench_family(tmp_path)
    out = tmp_path / "bench"
    code = main(["samplers", f"models.target={tmp_path / 'target'}", f"models.draft={tmp_path / 'draft'}",
                 "prompts.num=1", "prompts.tokens=48", "prompts.split=null", "max_new_tokens=12", "warmup_tokens=0",
                 "threads=1", "progress=false", f"output_dir={out}"])
    assert code == 0
    summary = json.loads((out / "results.json").read_text())["summary"]
    coupled = [e for e in summary if e["row"].endswith(" coupled")]
    assert len(coupled) == 2 * 5                     # 5 rows (no heads: medusa skipped) x 2 prompt sets
    assert all(e["identity"] == {"identical": 1, "compared": 1, "mismatches": 0} for e in coupled)
    assert all(e["identity"] is None for e in summary if e["row"].endswith(" rejection"))
    assert "same as coupled AR" in (out / "results.md").read_text()


def test_sampler_must_be_a_name():
    """A non-string sampler (e.g. a numpy array) is a clear error, not numpy's ambiguous truth value."""
    import numpy as np
    target = target_of("llama")
    for bad in (np.array(["coupled", "x"]), np.array(["coupled"]), 1):
        with pytest.raises(InputError, match="sampler must be one of rejection, coupled"):
            Speculator(target, None, Autoregressive()).generate(PROMPT, max_new_tokens=2, temperature=1.0, sampler=bad)


def test_suffix_reproduces_autoregressive(arch):
    """suffix's cache holds the texts of other seeds (partly the same text) and, for the last seed,
    that seed's own text: drafts are then accepted in full, in part or not at all, and the text is
    autoregressive's for every seed."""
    from specdec.strategies.suffix import Suffix
    target = with_output_bias(target_of(arch), token=7, bias=3.0 if arch == "gpt2" else 5.0)
    strategy = Suffix(max_spec_factor=4.0, max_nodes=8)
    kinds = Counter()
    for seed in (0, 1, 2, 3):
        expected = autoregressive(target, PROMPT, seed, n=32)
        if seed == 3:
            strategy.cache.add("default", PROMPT[-3:] + expected)
        tokens, step_kinds = run(target, strategy, PROMPT, seed, n=32)
        assert tokens == expected
        kinds += step_kinds
        strategy.cache.add("default", PROMPT[-3:] + tokens)
    assert kinds["all"] > 0 and kinds["none"] > 0 and kinds["partial"] > 0, kinds


def test_token_recycling_reproduces_autoregressive(arch):
    """token_recycling's table (seeded by the prefill, rewritten by every node of every forward, kept
    across the seeds' calls) drafts trees accepted in full, in part or not at all, and the text is
    autoregressive's for every seed; under the rejection sampler the same seeds give other texts (the
    control: the identity is the coupled sampler's doing)."""
    from specdec.costmodel import CostProfile
    from specdec.strategies.token_recycling import TokenRecycling
    target = with_output_bias(target_of(arch), token=7, bias=3.0 if arch == "gpt2" else 5.0)
    strategy = TokenRecycling(k=4, max_nodes=12, costs=CostProfile((0, 64), (1.0, 1.2), 0))
    kinds = Counter()
    for seed in (0, 1, 2):
        tokens, step_kinds = run(target, strategy, PROMPT, seed, n=32)
        assert tokens == autoregressive(target, PROMPT, seed, n=32)
        kinds += step_kinds
    assert kinds["all"] > 0 and kinds["none"] > 0 and kinds["partial"] > 0, kinds
    differs = [run(target, strategy, PROMPT, seed, sampler="rejection", n=32)[0]
               != autoregressive(target, PROMPT, seed, sampler="rejection", n=32) for seed in range(4)]
    assert any(differs)


def test_rest_reproduces_autoregressive(arch, tmp_path):
    """rest drafting from a datastore of other seeds' texts (and the last seed's own): accepted in full,
    in part or not at all, and the text is autoregressive's for every seed; under the rejection sampler the
    same seeds give other texts (the control: the identity is the coupled sampler's doing)."""
    from specdec.strategies.datastore import build
    from specdec.strategies.rest import Rest
    target = with_output_bias(target_of(arch), token=7, bias=3.0 if arch == "gpt2" else 5.0)
    texts = [PROMPT[-3:] + autoregressive(target, PROMPT, seed, n=32) for seed in (0, 1, 5)]
    build(texts, tmp_path / "ds", "coupled test")
    kinds = Counter()
    for seed in (2, 3, 5):
        tokens, step_kinds = run(target, Rest(str(tmp_path / "ds"), max_nodes=8), PROMPT, seed, n=32)
        assert tokens == autoregressive(target, PROMPT, seed, n=32)
        kinds += step_kinds
    assert kinds["all"] > 0 and kinds["none"] > 0 and kinds["partial"] > 0, kinds
    differs = [run(target, Rest(str(tmp_path / "ds"), max_nodes=8), PROMPT, seed, sampler="rejection", n=32)[0]
               != autoregressive(target, PROMPT, seed, sampler="rejection", n=32) for seed in (2, 3, 5, 6)]
    assert any(differs)


def test_lookahead_reproduces_autoregressive(arch):
    """lookahead's window (the target's argmax guesses) and pool (with the context's n-grams) draft trees
    accepted in full, in part or not at all, and the text is autoregressive's for every seed; under the
    rejection sampler the same seeds give other texts (the control)."""
    from specdec.strategies.lookahead import Lookahead
    target = with_output_bias(target_of(arch), token=7, bias=3.0 if arch == "gpt2" else 5.0)
    kinds = Counter()
    for seed in (0, 1, 2):
        strategy = Lookahead(window=3, ngram=3, guesses=3, pool_from_context=True)
        tokens, step_kinds = run(target, strategy, PROMPT, seed, n=32)
        assert tokens == autoregressive(target, PROMPT, seed, n=32)
        kinds += step_kinds
    assert kinds["all"] > 0 and kinds["none"] > 0 and kinds["partial"] > 0, kinds
    strategy = Lookahead(window=3, ngram=3, guesses=3, pool_from_context=True)
    differs = [run(target, strategy, PROMPT, seed, sampler="rejection", n=32)[0]
               != autoregressive(target, PROMPT, seed, sampler="rejection", n=32) for seed in range(4)]
    assert any(differs)
