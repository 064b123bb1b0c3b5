"""The cost model behind `auto`: what a verify forward of n tree nodes costs on this machine.

`measure_verify_costs` times the real Verifier on the target: a prefill of `context_len` tokens,
then forwards of [pending token] + a tree of n nodes (a binary tree: it needs the tree mask, as
the trees `auto` sends do) for every n up to the planner's ceiling, `repeats` rounds over all sizes,
the median kept; the cache is rolled back after each forward. `load_or_measure` caches the result
on disk, keyed by the target's fingerprint, device, dtype, torch thread count, sizes and context
length ($SPECDEC_HOME/profiles, else ~/.cache/specdec/profiles); `specdec profile` redoes it.

Every size is timed and kept as measured, not forced to grow with n: the cost of a forward is not
monotone in its rows. On the 2-core CPU the pycode target was measured on, 15 rounds gave (x a
plain step) 1.31 / 1.43 / 1.43 for 1 / 2 / 3 nodes but 1.19 / 1.16 for 4 / 5, and the same for 8 and
11 nodes: the matmul kernels change with the row count. The planner scans every size, so it picks
the cheap ones. (Profiles of a few sizes made non-decreasing - "the cheapest size at or above" -
priced 1-3 nodes like 4 and let it verify 2 nodes for the cost of 4.)
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch


def profile_sizes(max_nodes: int) -> tuple[int, ...]:
    """The tree sizes to time for a planner that verifies at most max_nodes nodes: every one."""
    return tuple(range(max(max_nodes, 1) + 1))


@dataclass(frozen=True)
class CostProfile:
    sizes: tuple[int, ...]          # tree sizes measured (0 = the pending token alone: plain decoding)
    seconds: tuple[float, ...]      # median verify forward time of each size
    context_len: int                # committed tokens in the cache while measuring
    key: str = ""                   # what it was measured on (see profile_key)

    def verify_cost(self, num_nodes: int) -> float:
        """Seconds to verify num_nodes tree nodes: linear between measured sizes, extended past
        the last one with the slope of the last two."""
        sizes, seconds = self.sizes, self.seconds
        if num_nodes <= sizes[0]:
            return seconds[0]
        for (n0, s0), (n1, s1) in zip(zip(sizes, seconds), zip(sizes[1:], seconds[1:])):
            if num_nodes <= n1:
                return s0 + (s1 - s0) * (num_nodes - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = (sizes[-2], seconds[-2]), (sizes[-1], seconds[-1])
        return s1 + max(s1 - s0, 0.0) / (n1 - n0) * (num_nodes - n1)

    def relative(self) -> list[float]:
        """v(n) / v(0): cost in plain decoding steps."""
        return [s / self.seconds[0] for s in self.seconds]


def binary_tree(num_nodes: int) -> tuple[int, ...]:
    """parents of a binary tree of num_nodes nodes in breadth-first order."""
    return tuple(-1 if i < 2 else (i - 2) // 2 for i in range(num_nodes))


def _now(device: torch.device) -> float:
    if device.type == "cuda":       # profiling only: a sync here is what makes the time honest
        torch.cuda.synchronize(device)
    return time.perf_counter()


def measure_verify_costs(target, sizes: Sequence[int], context_len: int, repeats: int) -> CostProfile:
    """Median seconds of one verify forward of each tree size in `sizes` (ascending), on top of a
    cache of context_len tokens, with the real Verifier; as measured (not monotone, see above)."""
    from .tree import CandidateTree
    from .verifier import Verifier
    verifier = Verifier(target)
    vocab = target.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (context_len,), generator=generator).tolist()
    verifier.prefill(prompt)
    prefix = verifier.prefix_len
    trees = {n: CandidateTree(torch.randint(3, vocab, (n,), generator=generator), binary_tree(n)) for n in sizes}
    verifier.forward(prompt[-1], trees[max(sizes)])          # warm-up
    verifier.commit([])
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):                                 # rounds over all sizes: drift hits every size alike
        for n in sizes:
            start = _now(verifier.device)
            verifier.forward(prompt[-1], trees[n])
            times[n].append(_now(verifier.device) - start)
            verifier.commit([])                              # roll the cache back to the prefix
            assert verifier.prefix_len == prefix
    seconds = [statistics.median(times[n]) for n in sizes]
    return CostProfile(tuple(sizes), tuple(seconds), context_len)


def profile_key(target, sizes: Sequence[int], context_len: int) -> str:
    """What a profile depends on: the target's weights (heads.io's fingerprint), device, dtype,
    torch threads, sizes and context length."""
    from .heads.io import target_identity
    identity = target_identity(target)
    parts = [identity["architecture"], identity["hidden_size"], identity["vocab_size"],
             [round(x, 5) for x in identity["fingerprint"]], sum(p.numel() for p in target.parameters()),
             str(target.device), str(target.dtype), torch.get_num_threads(), list(sizes), context_len]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def profile_dir() -> str:
    home = os.environ.get("SPECDEC_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdec")
    return os.path.join(os.path.abspath(os.path.expanduser(home)), "profiles")


def load_or_measure(target, sizes: Sequence[int], context_len: int, repeats: int,
                    refresh: bool = False) -> CostProfile:
    """The cached profile of this target on this device (measured now when absent or refresh)."""
    key = profile_key(target, sizes, context_len)
    path = os.path.join(profile_dir(), f"verify-{key}.json")
    if not refresh and os.path.isfile(path):
        try:
            with open(path) as f:
                data = json.load(f)
            return CostProfile(tuple(data["sizes"]), tuple(data["seconds"]), data["context_len"], key)
        except (OSError, ValueError, KeyError):
            pass                                             # unreadable: measure again
    profile = measure_verify_costs(target, sizes, context_len, repeats)
    profile = CostProfile(profile.sizes, profile.seconds, profile.context_len, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(asdict(profile), f)
    os.replace(tmp, path)                                    # atomic: a reader never sees half a file
    return profile
