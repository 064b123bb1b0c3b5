"""The engine's host-sync budget, counted on CPU with tests/host_reads.py: device ->
host reads (conversions and ops sized by their data) and host -> device writes, which on a GPU each
wait for the device or copy to it.

Per verify step, from the first propose on, the loop, acceptance and commit:
  * read the device back at most once when greedy or coupled, twice when rejection sampling - for
    one sequence, and for a whole batch (generate(list));
  * write host data to the device only for a tree shape not seen before (its mask / position /
    path table, and its rejection index when sampling, cached per shape) and once per KEY_WINDOW
    positions under the coupled sampler (the noise keys): the pending token stays on the device
    (the verdict's, greedy, coupled or drawn).
    A batch adds one write per row that finishes (the rows kept).

The call's setup (generation_config processing, prefill, strategy reset, the first pending token)
happens once per call and is not a step; it is reported in the message. Syncs of area "strategy"
(drafting) are another budget's (tests/test_host_reads_drafters.py).
"""
from __future__ import annotations

import contextlib
import math
from unittest import mock

import pytest

from conftest import noisy_copy, tiny_model
from host_reads import HostReads
from specdec import Speculator
from specdec.coupled import KEY_WINDOW
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.strategies.token_recycling import TokenRecycling
from specdec.strategies.lookahead import Lookahead
from specdec.batch import BatchVerifier
from specdec.compiled import padded_parents
from specdec.tree import is_chain, with_pending_root

pytestmark = pytest.mark.usefixtures("gpu_paths")   # a GPU's budget (conftest.gpu_paths)

TARGET = tiny_model("llama", seed=0, sharpen=4.0)
DRAFT = noisy_copy(TARGET, 0.3)
PROMPT = [5, 17, 33, 9, 41, 60, 70, 5, 17, 33, 9, 41, 60]     # repeats itself: prompt lookup proposes
PROMPTS = [PROMPT, [7, 8, 9, 10, 7, 8, 9], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7]]
NEW_TOKENS = 24

STRATEGIES = {
    "autoregressive": lambda: Autoregressive(),
    "prompt_lookup": lambda: PromptLookup(),
    "draft_chain": lambda: DraftModel(DRAFT, num_tokens=4, adaptive=False),
    "draft_tree": lambda: DraftModel(DRAFT, num_tokens=3, branching=[2, 2, 1], adaptive=False),
    "token_recycling": lambda: TokenRecycling(profile=False),     # asks for every row's top-k: still no read
    "lookahead": lambda: Lookahead(window=3, ngram=3, guesses=2),   # its argmax read is the strategy's own
}
SAMPLERS = {   # name: (generate arguments, engine reads allowed per step)
    "greedy": (dict(temperature=0.0), 1),
    "coupled": (dict(temperature=0.8, sampler="coupled"), 1),
    "rejection": (dict(temperature=0.8, sampler="rejection"), 2),
}


class Count:
    """Engine reads and writes from the first propose on, and the tree shapes the strategy proposed."""

    def __init__(self, speculator, prompt, extra=None, **kwargs):
        cls = type(speculator.strategy)
        propose = cls.propose
        self.setup: tuple[int, int] | None = None
        self.shapes: set = set()

        def marked_propose(strategy, state):
            if self.setup is None:
                self.setup = (reads.total("engine"), reads.writes("engine"))
            tree = propose(strategy, state)
            if not tree.is_chain:           # a chain's tables are built on the device
                self.shapes.add(with_pending_root(tree.parents))
            return tree

        propose_start = getattr(cls, "propose_start", None)

        def marked_propose_start(strategy, state):
            """A batch's two-phase proposal (draft-model chains drafted together): the first step's start."""
            if self.setup is None:
                self.setup = (reads.total("engine"), reads.writes("engine"))
            return propose_start(strategy, state)

        batch_forward = BatchVerifier.forward

        def spied_batch_forward(batch, pending, trees, *args, **kwargs):
            """A batch pads every row's [pending] + tree to the largest: the shapes its masks are made for."""
            width = 1 + max(tree.num_nodes for tree in trees)
            for tree in trees:
                parents = padded_parents(with_pending_root(tree.parents), width)
                if not is_chain(parents):
                    self.batch_shapes.add(parents)
            return batch_forward(batch, pending, trees, *args, **kwargs)

        self.batch_shapes: set = set()
        # on the class: a batch runs per-call copies of the strategy
        with HostReads() as reads, mock.patch.object(cls, "propose", marked_propose), \
                mock.patch.object(BatchVerifier, "forward", spied_batch_forward), \
                (mock.patch.object(cls, "propose_start", marked_propose_start) if propose_start is not None
                 else contextlib.nullcontext()), \
                (extra() if extra is not None else contextlib.nullcontext()):
            self.out = speculator.generate(prompt, max_new_tokens=NEW_TOKENS, seed=0, ignore_eos=True, **kwargs)
        self.syncs = reads
        self.reads = reads.total("engine") - self.setup[0]
        self.writes = reads.writes("engine") - self.setup[1]
        self.steps = self.out.stats.target_forwards

    def message(self, what: str) -> str:
        return (f"{what}: {self.reads} engine reads, {self.writes} engine writes in {self.steps} steps "
                f"({len(self.shapes)} tree shapes; at setup {self.setup[0]} reads, {self.setup[1]} writes)\n"
                f"{self.syncs.report()}")


def write_budget(sampler: str, count: Count, steps: int, finished_rows: int = 0) -> int:
    """Writes allowed: one per new tree shape (a batch's: each row's tree padded to the step's
    largest; two under rejection sampling), the coupled noise's key windows, and one per finished
    row of a batch."""
    shapes = len(count.batch_shapes if finished_rows else count.shapes)
    # a new shape's mask / position / path table, and under rejection sampling its rejection index
    budget = shapes * (2 if sampler == "rejection" else 1) + finished_rows
    if sampler == "coupled":
        budget += math.ceil((NEW_TOKENS + 8) / KEY_WINDOW) + 1      # + 8: a tree's depth past the end
    return budget


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_engine_syncs_per_step_within_budget(strategy, sampler):
    kwargs, budget = SAMPLERS[sampler]
    count = Count(Speculator(TARGET, None, STRATEGIES[strategy]()), PROMPT, **kwargs)
    assert count.steps > 0
    assert count.reads <= budget * count.steps, count.message(f"{strategy}/{sampler} reads")
    assert count.writes <= write_budget(sampler, count, count.steps), count.message(f"{strategy}/{sampler} writes")


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_batch_syncs_per_step_within_budget(strategy, sampler):
    """generate(list): one read per batched step for all rows greedy and coupled, two rejection
    sampling; writes as for one sequence plus one per row that finishes before the others (rows of
    different lengths: the rows finish at different steps)."""
    kwargs, budget = SAMPLERS[sampler]
    count = Count(Speculator(TARGET, None, STRATEGIES[strategy]()), PROMPTS, batch_size=len(PROMPTS),
                  **kwargs)
    steps = count.out.stats.target_forwards                   # batched forwards
    assert steps > 0 and len(count.out) == len(PROMPTS)
    assert count.reads <= budget * steps, count.message(f"batch {strategy}/{sampler} reads")
    assert count.writes <= write_budget(sampler, count, steps, len(PROMPTS)), \
        count.message(f"batch {strategy}/{sampler} writes")


def test_the_counter_sees_a_deliberate_extra_read():
    """Negative control: one .item() more per step in the engine's acceptance breaks the budget."""
    import specdec.loop
    original = specdec.loop.accept_greedy

    def accept_with_extra_read(tree, target_tokens, *rest):
        target_tokens[0].item()
        return original(tree, target_tokens, *rest)

    count = Count(Speculator(TARGET, None, STRATEGIES["draft_chain"]()), PROMPT, temperature=0.0,
                  extra=lambda: mock.patch("specdec.loop.accept_greedy", accept_with_extra_read))
    assert count.reads == 2 * count.steps, count.message("extra read")


def test_the_counter_sees_the_pending_token_sent_from_the_host():
    """Negative control: a loop that sends the pending token from the host (what main did) makes one
    write per step, over the greedy budget."""
    from specdec.loop import Decoding
    count = Count(Speculator(TARGET, None, STRATEGIES["draft_chain"]()), PROMPT, temperature=0.0,
                  extra=lambda: mock.patch.object(Decoding, "pending_token", lambda self: self.state.token_ids[-1]))
    assert count.writes >= count.steps > write_budget("greedy", count, count.steps), count.message("host pending")


def test_the_counter_sees_a_batch_read_per_row():
    """Negative control: rows that each read their own verdict (no shared read) break the batch's budget."""
    import specdec.batch
    count = Count(Speculator(TARGET, None, STRATEGIES["draft_chain"]()), PROMPTS, batch_size=len(PROMPTS),
                  temperature=0.0,
                  extra=lambda: mock.patch.object(specdec.batch, "batch_verdicts", lambda decodings, trees, logits: [
                      decoding.decide(tree, logits[row, :1 + tree.num_nodes])
                      for row, (decoding, tree) in enumerate(zip(decodings, trees))]))
    assert count.reads > count.out.stats.target_forwards, count.message("a read per row")


def test_profile_flag_reaches_the_stats():
    speculator = Speculator(TARGET, None, Autoregressive())
    out = speculator.generate(PROMPT, max_new_tokens=4, ignore_eos=True)
    assert out.stats.profiled is True          # on a CPU the split is exact without profile
    assert out.stats.total_time_s > 0 and out.stats.verify_time_s > 0
    speculator.profile = True
    out = speculator.generate(PROMPT, max_new_tokens=4, ignore_eos=True)
    assert out.stats.profiled is True and out.stats.as_dict()["profiled"] is True


def test_logits_processing_syncs_within_budget():
    """A checkpoint whose generation_config asks for processing (a repetition penalty): the engine's
    processors take the rows of each depth with device indices (no nonzero per depth, a read each),
    so reads stay one per step; writes add one per step, the committed ids the processors read."""
    target = tiny_model("llama", seed=0, sharpen=4.0)
    target.generation_config.repetition_penalty = 1.3
    strategy = DraftModel(noisy_copy(target, 0.3), num_tokens=3, branching=[2, 2, 1], adaptive=False)
    count = Count(Speculator(target, None, strategy), PROMPT, temperature=0.0)
    assert count.reads <= count.steps, count.message("processing reads")
    assert count.writes <= count.steps + write_budget("greedy", count, count.steps), count.message("processing writes")
