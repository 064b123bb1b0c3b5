"""The strategy protocol is the engine's whole view of a strategy (strategies/base.py): the engine
(and a strategy that drives others: auto's lookup and drafter) touches nothing a strategy does not
declare there. Every registered strategy runs through the public API, one prompt and a small batch,
behind a proxy that records every access to an undeclared name (a getattr(strategy, "hook", None)
probe included: the proxy raises AttributeError, which such a probe swallows, so the record is what
fails the test)."""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field

import pytest
import torch

from zoo import random_heads
from conftest import hf_greedy, noisy_copy, tiny_model
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec import loop as loop_module
from specdec.strategies import REGISTRY
from specdec.strategies.auto import Auto
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.base import BaseStrategy, BatchDrafter, DraftRows, LookupPart
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.strategies.early_exit import EarlyExit
from specdec.strategies.layer_skip import LayerSkip
from specdec.strategies.medusa import Medusa
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.strategies.suffix import Suffix
from specdec.strategies.lookahead import Lookahead
from specdec.strategies.rest import Rest
from specdec.strategies.sam import Sam
from specdec.strategies.token_recycling import TokenRecycling
from specdec.tree import CandidateTree

PROMPT = [5, 17, 33, 9, 41, 5, 17, 33, 9, 41, 5, 17]
PROMPTS = [PROMPT, [60, 70, 60, 70, 60], [8, 9, 10, 11, 12, 13, 8, 9], [3]]
N = 10


def declared(*protocols) -> frozenset[str]:
    """The names the protocol classes declare: annotated attributes, attributes with a default, methods."""
    names: set[str] = set()
    for cls in protocols:
        names |= set(cls.__dict__.get("__annotations__", {}))
        names |= {name for name in vars(cls) if not name.startswith("_")}
    return frozenset(names)


STRATEGY = declared(BaseStrategy)
LOOKUP = STRATEGY | declared(LookupPart)
DRAFTER = declared(BatchDrafter)
ROWS = declared(DraftRows)
# what a declared method returns that is itself seen through a protocol
RETURNS = {"for_call": "same", "batch_drafter": DRAFTER, "new_batch": ROWS}


@dataclass
class Log:
    undeclared: list[str] = field(default_factory=list)    # "<role>.<name>" of every undeclared access
    seen: set[str] = field(default_factory=set)            # "<role>.<name>" of every declared one


def _unwrap(value):
    """Arguments reach the object behind a proxy as themselves: a drafter's propose_many, a fit_batch
    and a DraftRows.release get the objects they made, not proxies of them."""
    if isinstance(value, Watched):
        return object.__getattribute__(value, "_watched")
    if type(value) in (list, tuple):
        return type(value)(_unwrap(item) for item in value)
    return value


class Watched:
    """`target` as the engine sees it, allowed only the names in `allowed`."""

    def __init__(self, target, allowed: frozenset[str], log: Log, role: str):
        for key, value in (("_watched", target), ("_allowed", allowed), ("_log", log), ("_role", role)):
            object.__setattr__(self, key, value)

    @property
    def __class__(self):                   # isinstance() answers for the object behind
        return type(object.__getattribute__(self, "_watched"))

    def __getattr__(self, name: str):
        target, allowed, log, role = (object.__getattribute__(self, key)
                                      for key in ("_watched", "_allowed", "_log", "_role"))
        if name not in allowed:
            log.undeclared.append(f"{role}.{name}")
            raise AttributeError(f"{role}: {name!r} is not declared by the strategy protocol")
        log.seen.add(f"{role}.{name}")
        value = getattr(target, name)
        if not callable(value):
            return value
        returns = RETURNS.get(name)

        def call(*args, **kwargs):
            out = value(*_unwrap(args), **{key: _unwrap(item) for key, item in kwargs.items()})
            if out is None or returns is None:
                return out
            watched_as = allowed if returns == "same" else returns
            return Watched(out, watched_as, log, role if returns == "same" else f"{role}.{name}()")
        return call

    def __copy__(self):                    # a copy of the object behind (a bare strategy's per-call copy), watched
        get = lambda key: object.__getattribute__(self, key)    # noqa: E731
        return Watched(copy.copy(get("_watched")), get("_allowed"), get("_log"), get("_role"))

    def __setattr__(self, name: str, value) -> None:
        object.__getattribute__(self, "_log").undeclared.append(f"{object.__getattribute__(self, '_role')}.{name} =")
        raise AttributeError(f"the engine set {name!r} on a strategy")




class Bare:
    """A strategy written against the bare Strategy protocol (no BaseStrategy): guesses that the
    pending token repeats, and counts the calls it finished (a hook of its own)."""
    name = "bare"
    needs_hidden_states = False

    def __init__(self):
        self.finished = []

    def bind(self, target, tokenizer) -> None:
        self.device = target.device

    def reset(self, state) -> None:
        pass

    def propose(self, state) -> CandidateTree:
        depth = min(2, state.max_depth)
        return CandidateTree.chain([state.token_ids[-1]] * depth, device=self.device) if depth > 0 \
            else CandidateTree.empty(self.device)

    def observe(self, state, result) -> None:
        pass

    def finish(self, state) -> None:
        self.finished.append(len(state.token_ids) - state.prompt_len)


def random_mtp(target) -> "Mtp":
    """The mtp strategy over one random MTP module built for `target` (its config told it has one)."""
    from transformers.modeling_layers import MtpModel
    from specdec.heads.mtp import MtpDrafter
    from specdec.strategies.mtp import Mtp
    target.config.num_mtp_layers = 1
    torch.manual_seed(0)
    return Mtp(MtpDrafter(MtpModel(target, 1).eval(), id(target)), top_k=2, max_nodes=4)


def datastore_of(streams) -> str:
    """A REST datastore of `streams` in a fresh temporary folder."""
    import tempfile
    from specdec.strategies.datastore import build
    folder = tempfile.mkdtemp(prefix="specdec-rest-")
    build(streams, folder, "protocol test")
    return folder


# registry name, case, builder(target, log) -> the strategy (its parts watched where it has parts)
CASES = {
    "autoregressive": ("autoregressive", lambda target, log: Autoregressive()),
    "prompt_lookup": ("prompt_lookup", lambda target, log: PromptLookup(min_ngram=1, max_ngram=2)),
    "suffix": ("suffix", lambda target, log: Suffix()),
    "token_recycling": ("token_recycling", lambda target, log: TokenRecycling(profile=False)),
    "rest": ("rest", lambda target, log: Rest(datastore_of(PROMPTS))),
    "lookahead": ("lookahead", lambda target, log: Lookahead(window=3, ngram=3, guesses=2)),
    "sam": ("sam", lambda target, log: Sam(PromptLookup(min_ngram=2, max_ngram=3), TokenRecycling(profile=False))),
    "draft_chain": ("draft_model", lambda target, log: DraftModel(noisy_copy(target), num_tokens=3)),
    "draft_tree": ("draft_model", lambda target, log: DraftModel(noisy_copy(target), branching=[2, 1])),
    "medusa": ("medusa", lambda target, log: Medusa(random_heads(target), max_nodes=6, top_k=2)),
    "eagle": ("eagle", lambda target, log: Eagle(random_drafter(target), max_nodes=6, top_k=2, depth=3)),
    "eagle3": ("eagle", lambda target, log: Eagle(random_drafter(target, (0, 1, 2), draft_vocab=list(range(0, 96, 3))),
                                                  max_nodes=6, top_k=2, depth=3)),
    "early_exit_chain": ("early_exit", lambda target, log: EarlyExit(1, num_tokens=3)),
    "early_exit_tree": ("early_exit", lambda target, log: EarlyExit(1, branching=[2, 1])),
    "layer_skip_chain": ("layer_skip", lambda target, log: LayerSkip(attention=[0], mlp=[1], num_tokens=3)),
    "layer_skip_auto": ("layer_skip", lambda target, log: LayerSkip(auto=True, every=2, branching=[2, 1])),
    "mtp": ("mtp", lambda target, log: random_mtp(target)),
    "auto_draft": ("auto", lambda target, log: Auto(
        Watched(PromptLookup(min_ngram=1, max_ngram=2), LOOKUP, log, "auto.lookup"),
        Watched(DraftModel(noisy_copy(target), num_tokens=3), STRATEGY, log, "auto.drafter"),
        profile=False, explore_every=1)),
    "auto_eagle_suffix": ("auto", lambda target, log: Auto(
        Watched(Suffix(), LOOKUP, log, "auto.lookup"),
        Watched(Eagle(random_drafter(target, (0, 1, 2)), max_nodes=6, top_k=2, depth=3), STRATEGY, log,
                "auto.drafter"),
        profile=False, explore_every=1)),
    "auto_recycling": ("auto", lambda target, log: Auto(
        Watched(PromptLookup(min_ngram=1, max_ngram=2), LOOKUP, log, "auto.lookup"),
        Watched(TokenRecycling(profile=False), STRATEGY, log, "auto.drafter"), profile=False, explore_every=1)),
    "auto_rest": ("auto", lambda target, log: Auto(
        Watched(PromptLookup(min_ngram=1, max_ngram=2), LOOKUP, log, "auto.lookup"),
        Watched(Rest(datastore_of(PROMPTS)), STRATEGY, log, "auto.drafter"), profile=False, explore_every=1)),
    "auto_medusa": ("auto", lambda target, log: Auto(
        None, Watched(Medusa(random_heads(target), max_nodes=6, top_k=2), STRATEGY, log, "auto.drafter"),
        profile=False, explore_every=1)),
}
# hooks every run must have reached (the test's premise: the engine asked for them, through the proxy)
ALWAYS = {"bind", "reset", "propose", "observe", "finish", "needs_hidden_states", "max_nodes", "for_call",
          "use_compiled_verifier", "batch_drafter", "fit_batch"}


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=1, sharpen=4.0)


@pytest.fixture(scope="module")
def references(target):
    return [hf_greedy(target, prompt, N, eos_token_id=None) for prompt in PROMPTS]


def test_the_cases_cover_every_registered_strategy(target):
    """Every name in the registry has a case, built from that name's module, deriving from BaseStrategy."""
    assert {name for name, _ in CASES.values()} == set(REGISTRY)
    for name, build in CASES.values():
        strategy = build(target, Log())
        assert type(strategy).__module__ == REGISTRY[name] and isinstance(strategy, BaseStrategy)


def test_every_hook_states_its_contract():
    """Each declared method says when it is called and what it returns (a docstring of its own)."""
    for protocol in (BaseStrategy, BatchDrafter, DraftRows, LookupPart):
        for name, member in vars(protocol).items():
            function = member.__func__ if isinstance(member, staticmethod) else member
            if not name.startswith("_") and inspect.isfunction(function):
                assert (function.__doc__ or "").strip(), f"{protocol.__name__}.{name} has no contract"


def run_watched(target, strategy, log: Log) -> tuple[list[int], list[list[int]]]:
    """(one prompt's new tokens, a batch's) with `strategy` seen by the engine through the proxy."""
    sd = Speculator(target, None, Watched(strategy, STRATEGY, log, "strategy"))
    alone = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True).token_ids
    batch = sd.generate(PROMPTS, max_new_tokens=N, ignore_eos=True, batch_size=3)
    return alone, [out.token_ids for out in batch]


@pytest.mark.parametrize("case", list(CASES) + ["bare"])
def test_the_engine_calls_only_declared_hooks(case, target, references):
    log = Log()
    strategy = Bare() if case == "bare" else CASES[case][1](target, log)
    alone, batch = run_watched(target, strategy, log)
    assert log.undeclared == [], f"undeclared names the engine touched: {sorted(set(log.undeclared))}"
    # the premise: the runs went through the proxy, reached every hook, and were plain greedy decoding
    assert {f"strategy.{name}" for name in ALWAYS} <= log.seen
    assert alone == references[0] and batch == references
    if case == "bare":
        assert strategy.finished[:1] == [N]           # its own hook, reached through the defaults' view
    if case in ("draft_chain", "draft_tree", "early_exit_chain", "early_exit_tree", "layer_skip_chain", "eagle", "eagle3", "auto_draft", "auto_eagle_suffix"):
        drafted_together = {name.rsplit(".", 1)[1] for name in log.seen if "batch_drafter()" in name}
        assert {"batch_key", "new_batch", "propose_many", "release"} <= drafted_together
    if case.startswith("auto_"):
        parts = {name for name in log.seen if name.startswith("auto.")}
        assert {"auto.drafter.propose", "auto.drafter.observe_steps", "auto.drafter.finish"} <= parts
        if case != "auto_medusa":
            assert {"auto.lookup.propose_paths", "auto.lookup.catch_up", "auto.lookup.match_length"} <= parts


def test_an_undeclared_probe_fails_the_check(target, references, monkeypatch):
    """The control: an engine that probes an undeclared hook with getattr(..., None) (the probe
    swallows the AttributeError) runs on and decodes right, and the record still catches it."""
    real = loop_module.check_depth

    def probing_check_depth(tree, max_depth, strategy):
        getattr(strategy, "max_tree_depth", None)
        return real(tree, max_depth, strategy)
    monkeypatch.setattr(loop_module, "check_depth", probing_check_depth)
    log = Log()
    alone, batch = run_watched(target, PromptLookup(min_ngram=1, max_ngram=2), log)
    assert alone == references[0] and batch == references
    assert set(log.undeclared) == {"strategy.max_tree_depth"}
