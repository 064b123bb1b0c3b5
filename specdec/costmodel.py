"""The cost model behind `auto`: what a verify forward of n tree nodes costs on this machine.

`measure_verify_costs` times the real Verifier on the target: a prefill of `context_len` tokens,
then forwards of [pending token] + a tree of n nodes (a binary tree: it needs the tree mask, as
the trees `auto` sends do) for every n up to the planner's ceiling, `repeats` rounds over all sizes,
the median kept; the cache is rolled back after each forward. `load_or_measure` caches the result
on disk, keyed by the target's fingerprint, device, dtype, torch thread count, sizes and context
length, and on a CPU any hold on its kernels' instruction set (held_cpu_kernels)
($SPECDEC_HOME/profiles, else ~/.cache/specdec/profiles); `specdec profile` redoes it. A file
that is not a valid profile (check_profile) is measured again; a folder that cannot be written leaves
the profile measured in memory, with a warning (measured again at every load).

On a CPU the measurement also records how long it waited for a core (`cpu_wait`: the share of its
wall time the measuring thread was ready to run but not running, from Linux's schedstat). Other work
on the cores (a training job, a test suite) stretches each size's timing by a different factor, and
a profile measured so would misprice trees for as long as it is cached; so one that waited more than
SHARED_CPU is used by the process that measured it and never stored (it is measured again at the
next load, on a quieter machine).

Every size is timed and kept as measured, not forced to grow with n: the cost of a forward is not
monotone in its rows (the matmul kernels change with the row count; benchmarks/results/defaults.md
has a CPU's profile). The planner scans every size, so it picks the cheap ones; a profile made
non-decreasing would price small trees like the next cheap size up.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from .atomic import atomic_write_json
from .errors import ConfigError


def profile_sizes(max_nodes: int) -> tuple[int, ...]:
    """The tree sizes to time for a planner that verifies at most max_nodes nodes: every one."""
    return tuple(range(max(max_nodes, 1) + 1))


@dataclass(frozen=True)
class CostProfile:
    sizes: tuple[int, ...]          # tree sizes measured (0 = the pending token alone: plain decoding)
    seconds: tuple[float, ...]      # median verify forward time of each size
    context_len: int                # committed tokens in the cache while measuring
    key: str = ""                   # what it was measured on (see profile_key)
    cpu_wait: float | None = None   # CPU: share of the measurement's wall time spent waiting for a core (None: unknown)

    def verify_cost(self, num_nodes: int) -> float:
        """Seconds to verify num_nodes tree nodes: linear between measured sizes, extended past
        the last one with the slope of the last two."""
        sizes, seconds = self.sizes, self.seconds
        if num_nodes <= sizes[0]:
            return seconds[0]
        # the first measured size at or above num_nodes (a planner asks dozens of times a step: no scan)
        i = bisect.bisect_left(sizes, num_nodes)
        if i < len(sizes):
            (n0, s0), (n1, s1) = (sizes[i - 1], seconds[i - 1]), (sizes[i], seconds[i])
            return s0 + (s1 - s0) * (num_nodes - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = (sizes[-2], seconds[-2]), (sizes[-1], seconds[-1])
        return s1 + max(s1 - s0, 0.0) / (n1 - n0) * (num_nodes - n1)

    def relative(self) -> list[float]:
        """v(n) / v(0): cost in plain decoding steps."""
        return [s / self.seconds[0] for s in self.seconds]


def binary_tree(num_nodes: int) -> tuple[int, ...]:
    """parents of a binary tree of num_nodes nodes in breadth-first order."""
    return tuple(-1 if i < 2 else (i - 2) // 2 for i in range(num_nodes))


SHARED_CPU = 0.15      # a CPU profile whose measurement waited for a core longer than this share is not stored


def measured_on_shared_cpu(cpu_wait: float | None) -> bool:
    """Whether a measurement that waited for a core `cpu_wait` of its time (None: not measured, as on a
    GPU) shared the CPU with other work too much to be stored."""
    return cpu_wait is not None and cpu_wait > SHARED_CPU


def run_queue_wait_s() -> float | None:
    """Seconds the calling thread has spent ready to run but waiting for a core (Linux schedstat's
    second field); None where the kernel does not tell."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _now(device: torch.device) -> float:
    if device.type == "cuda":       # profiling only: a sync here is what makes the time honest
        torch.cuda.synchronize(device)
    return time.perf_counter()


def random_prompt_and_trees(target, sizes: Sequence[int], context_len: int):
    """(a seeded random prompt of context_len token ids, {n: a binary CandidateTree of n random tokens}):
    what a verify cost is timed on. On a target verified on chains (linear-attention layers: what its
    planners send) the trees are chains of n tokens."""
    from .models import verified_on_chains
    from .tree import CandidateTree
    vocab = target.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (context_len,), generator=generator).tolist()
    chains = verified_on_chains(target)
    trees = {}
    for n in sizes:
        tokens = torch.randint(3, vocab, (n,), generator=generator)
        trees[n] = CandidateTree.chain(tokens) if chains else CandidateTree(tokens, binary_tree(n))
    return prompt, trees


def measure_verify_costs(target, sizes: Sequence[int], context_len: int, repeats: int,
                         batch: int = 1, compile: bool = False, row_linear: int = 0) -> CostProfile:
    """Median seconds of one verify forward of each tree size in `sizes` (ascending), on top of a
    cache of context_len tokens, with the real Verifier; as measured (not monotone, see above).
    batch > 1: the batched forward (specdec.batch) of `batch` rows, each with a tree of that size:
    as the batch grows the forward turns compute-bound and tree nodes cost more.
    compile: time the verifier `compile: true` runs (specdec.compiled: static cache, one compiled
    graph per bucket of rows), each bucket compiled in an untimed round first; batches always run
    the eager batched forward, which is what generate(list) runs.
    row_linear: time the verifier with that `row_linear` setting (specdec.row_linear), as the steps run it."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"measure_verify_costs: repeats={repeats!r}; it must be an integer >= 1 "
                          f"(rounds over every size, the median of each kept)")
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
        raise ConfigError(f"measure_verify_costs: context_len={context_len!r}; it must be an integer >= 1 "
                          f"(tokens in the cache while measuring)")
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sizes):
        raise ConfigError(f"measure_verify_costs: sizes={list(sizes)!r}; give tree sizes as integers >= 0, "
                          f"e.g. profile_sizes(max_nodes)")
    prompt, trees = random_prompt_and_trees(target, sizes, context_len)
    if batch <= 1:
        forward, rollback = _single_forward(target, prompt, trees, compile, row_linear)
    else:
        forward, rollback = _batched_forward(target, prompt, trees, batch, row_linear)
    for n in (sizes if compile and batch <= 1 else [max(sizes)]):   # warm-up (compiled: every bucket)
        forward(n)
        rollback()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    wall_start, wait_start = time.perf_counter(), run_queue_wait_s()
    for _ in range(repeats):                                 # rounds over all sizes: drift hits every size alike
        for n in sizes:
            start = _now(target.device)
            forward(n)
            times[n].append(_now(target.device) - start)
            rollback()
    wait_end, wall = run_queue_wait_s(), time.perf_counter() - wall_start
    cpu_wait = None
    if target.device.type == "cpu" and wait_start is not None and wait_end is not None:
        cpu_wait = round((wait_end - wait_start) / max(wall, 1e-9), 3)
    seconds = [statistics.median(times[n]) for n in sizes]
    return CostProfile(tuple(sizes), tuple(seconds), context_len, cpu_wait=cpu_wait)


def _single_forward(target, prompt: list[int], trees: dict, compile: bool = False, row_linear: int = 0):
    """(forward of n nodes, roll back) with the real Verifier (compiled with `compile`, as
    Speculator(compile=True) builds it) over a prefill of the prompt; the cache is rolled back to
    the prefix after each forward."""
    from .verifier import Verifier
    verifier = Verifier(target, compile=compile, row_linear=row_linear)
    if compile:
        verifier.reserve(len(prompt) + max(trees) + 1)
    verifier.prefill(prompt)
    prefix = verifier.prefix_len

    def rollback():
        verifier.commit([])
        assert verifier.prefix_len == prefix
    return (lambda n: verifier.forward(prompt[-1], trees[n])), rollback


def _batched_forward(target, prompt: list[int], trees: dict, batch: int, row_linear: int = 0):
    """(forward of n nodes per row, roll back) for `batch` rows (specdec.batch): one prompt
    prefilled, copied into every row; a forward writes after the rows' fills and commits nothing,
    so there is nothing to roll back."""
    from .batch import BatchVerifier
    from .verifier import Verifier
    single = Verifier(target, row_linear=row_linear)
    single.prefill(prompt[:-1])
    batched = BatchVerifier(target, single.layout, row_model=single.row_model, row_linear=single.row_linear)
    room = len(prompt) + max(trees) + 1
    for row in range(batch):
        batched.set_row(row, single.cache.layers, 0, single.prefix_len, room)
    pending = [prompt[-1]] * batch
    return (lambda n: batched.forward(pending, [trees[n]] * batch, None)), (lambda: None)


def profile_key(target, sizes: Sequence[int], context_len: int, batch: int = 1, compile: bool = False,
                row_linear: int = 0) -> str:
    """What a profile depends on: the target's weights (heads.io's fingerprint), device, dtype,
    torch threads, sizes, context length, batch, whether the verifier is compiled and its
    row_linear setting (and whether its weights are packed: specdec.row_linear), and on a CPU the
    variables holding its kernels to an older instruction set (held_cpu_kernels)."""
    from .heads.io import target_identity
    from .models import verified_on_chains
    from .row_linear import packs
    identity = target_identity(target)
    parts = [identity["architecture"], identity["hidden_size"], identity["vocab_size"],
             [round(x, 5) for x in identity["fingerprint"]], sum(p.numel() for p in target.parameters()),
             str(target.device), str(target.dtype), torch.get_num_threads(), list(sizes), context_len]
    if batch > 1:                     # batch-1 keys stay as they were: profiles on disk stay valid
        parts.append(batch)
    if compile and batch <= 1:        # likewise eager keys (a batch runs eager whatever compile says)
        parts.append("compiled")
    if row_linear:                    # likewise keys with the setting off
        parts.append(["row_linear", int(row_linear)])
        if packs(target, row_linear):     # and keys of the kernels before packed weights
            parts.append("packed")
    if verified_on_chains(target):        # timed on chains (random_prompt_and_trees), not binary trees
        parts.append("chains")
    held = held_cpu_kernels() if target.device.type == "cpu" else {}
    if held:                              # likewise keys with no hold set: a profile measured with the CPU's own
        parts.append(["kernels", held])   # kernels does not price ones held to an older instruction set, or the reverse
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


# what holds PyTorch's CPU kernels (ATen's own, oneDNN's under its new and old names, MKL's) to an instruction set
# below the CPU's: a run so held costs what an older CPU would, so it keeps profiles of its own. Each library reads
# its variable once, at start-up, so the key follows the environment as the process found it (set them before
# starting Python, as one must for them to act at all)
HELD_KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def held_cpu_kernels() -> dict[str, str]:
    """{variable: value} of the HELD_KERNEL_VARIABLES set (to anything but blanks) in this process's environment,
    values stripped and lower-cased (the libraries read "AVX2" and "avx2" alike)."""
    held = {name: os.environ.get(name, "").strip().lower() for name in HELD_KERNEL_VARIABLES}
    return {name: value for name, value in held.items() if value}


def profile_dir() -> str:
    home = os.environ.get("SPECDEC_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdec")
    return os.path.join(os.path.abspath(os.path.expanduser(home)), "profiles")


def profile_path(key: str) -> str:
    return os.path.join(profile_dir(), f"verify-{key}.json")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_profile(data, sizes: Sequence[int] | None = None) -> str | None:
    """What makes `data` (a profile file's JSON) unusable, or None when it is a valid profile (of
    these `sizes` when given): a mapping with `sizes` (ascending integers >= 0, at least two: the
    cost is interpolated between them), `seconds` (as many finite timings > 0: a zero, negative or
    NaN cost would make verifying look free or never worth it) and `context_len` (an integer >= 0)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    missing = [k for k in ("sizes", "seconds", "context_len") if k not in data]
    if missing:
        return f"missing key(s) {', '.join(missing)}"
    measured, seconds = data["sizes"], data["seconds"]
    if not isinstance(measured, list) or len(measured) < 2 or not all(_is_int(n) and n >= 0 for n in measured):
        return f"'sizes' must be a list of at least two integers >= 0, got {measured!r}"
    if any(b <= a for a, b in zip(measured, measured[1:])):
        return f"'sizes' must be ascending, got {measured!r}"
    if sizes is not None and list(measured) != list(sizes):
        return f"'sizes' {measured!r} are not the sizes asked for, {list(sizes)!r}"
    if not isinstance(seconds, list) or len(seconds) != len(measured):
        return f"'seconds' must be a list of {len(measured)} timings (one per size), got {seconds!r}"
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0
               for t in seconds):
        return f"'seconds' must be finite timings > 0, got {seconds!r}"
    if not _is_int(data["context_len"]) or data["context_len"] < 0:
        return f"'context_len' must be an integer >= 0, got {data['context_len']!r}"
    wait = data.get("cpu_wait")
    if wait is not None and not (isinstance(wait, (int, float)) and not isinstance(wait, bool)
                                 and math.isfinite(wait) and wait >= 0):
        return f"'cpu_wait' must be a number >= 0 or null, got {wait!r}"
    if measured_on_shared_cpu(wait):
        return f"it was measured while other work held the CPU ({cpu_wait_words(wait)})"
    return None


def cpu_wait_words(wait: float) -> str:
    return f"it waited for a core {wait:.0%} of the time"


def read_profile(path: str, key: str, sizes: Sequence[int] | None = None) -> CostProfile | None:
    """The profile stored at `path`; None when there is none, or (with a warning naming the file)
    when it cannot be read or is not a valid profile."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        problem = check_profile(data, sizes)
    except (OSError, ValueError) as exc:
        problem = f"unreadable ({exc})"
    if problem is not None:
        warnings.warn(f"cost profile {path} is not valid: {problem}; measuring it again "
                      f"(`specdec profile` redoes it; deleting the file does too)", stacklevel=3)
        return None
    return CostProfile(tuple(data["sizes"]), tuple(float(t) for t in data["seconds"]), data["context_len"], key,
                       data.get("cpu_wait"))


def store_profile(profile: CostProfile, path: str) -> None:
    """Write the profile atomically (a reader never sees half a file); OSError when the folder
    cannot be made or written."""
    atomic_write_json(path, asdict(profile))


def measure_and_store(target, sizes: Sequence[int], context_len: int, repeats: int, batch: int = 1,
                      compile: bool = False, row_linear: int = 0) -> tuple[CostProfile, str, str | None]:
    """Measure the profile now and store it where `load_or_measure` reads it: (profile, its path,
    why it was not stored, or None). A CPU profile measured while other work held the cores
    (cpu_wait > SHARED_CPU) is not stored; nor is one whose folder cannot be written."""
    key = profile_key(target, sizes, context_len, batch, compile, row_linear)
    path = profile_path(key)
    profile = measure_verify_costs(target, sizes, context_len, repeats, batch, compile, row_linear)
    profile = CostProfile(profile.sizes, profile.seconds, profile.context_len, key, profile.cpu_wait)
    if measured_on_shared_cpu(profile.cpu_wait):
        return profile, path, (f"other work held the CPU while measuring ({cpu_wait_words(profile.cpu_wait)}), "
                               f"so its timings are not this machine's; `specdec profile` on a quiet machine "
                               f"stores one")
    try:
        store_profile(profile, path)
    except OSError as exc:
        return profile, path, (f"the folder cannot be written ({exc.strerror or exc}); set SPECDEC_HOME to a "
                               f"writable folder to keep it")
    return profile, path, None


def planning_costs(target, profile: bool, sizes: Sequence[int], context_len: int, repeats: int,
                   compile: bool = False, row_linear: int = 0) -> CostProfile:
    """The verify costs a planner (auto, token_recycling) plans with on `target`: the cached or measured
    profile (load_or_measure) when `profile`, else a guess (a tree node costs a tenth of a plain step)."""
    if profile:
        return load_or_measure(target, sizes, context_len, repeats, compile=compile, row_linear=row_linear)
    return CostProfile((0, 1), (1.0, 1.1), 0, "guess")


def load_or_measure(target, sizes: Sequence[int], context_len: int, repeats: int,
                    refresh: bool = False, batch: int = 1, compile: bool = False,
                    row_linear: int = 0) -> CostProfile:
    """The cached profile of this target on this device (measured now when absent, not valid, or
    refresh), for verify forwards of `batch` rows, by the compiled verifier with `compile`. A
    profile that cannot be stored is used all the same, with one warning."""
    if not refresh:
        key = profile_key(target, sizes, context_len, batch, compile, row_linear)
        cached = read_profile(profile_path(key), key, sizes)
        if cached is not None:
            return cached
    profile, path, not_stored = measure_and_store(target, sizes, context_len, repeats, batch, compile, row_linear)
    if not_stored is not None:
        warnings.warn(f"could not store the cost profile in {path}: {not_stored}. Using the one measured now, "
                      f"for this process only (measured again at the next load)", stacklevel=2)
    return profile


def batch_bucket(batch: int) -> int:
    """The power of two at or above a batch size (1 for 1): the batch sizes one cost profile and one
    batch gate serve."""
    return 1 << (batch - 1).bit_length()


def batch_costs(profiles: dict, target, batch: int, sizes: Sequence[int], context_len: int, repeats: int,
                row_linear: int = 0) -> CostProfile:
    """The verify costs for forwards of `batch` (> 1) rows: the profile of its bucket (batch_bucket), measured
    the first time a batch that size runs (cached on disk like the one-row profile) and kept in `profiles`
    (bucket -> profile: a planner's, shared by its per-call copies). As the batch grows the forward turns
    compute-bound, tree nodes cost more, and a planner drafts less or nothing. Every smaller bucket is measured
    with it: a batch shrinks through them as its last prompts finish, and a measurement then would stall the
    batch's last steps."""
    bucket = batch_bucket(batch)
    if bucket not in profiles:
        sparse = tuple(n for n in sizes if n <= 4 or n in (6, 8, 12, 16, 24, 32, 48, 64) or n == sizes[-1])
        smaller = 2
        while smaller <= bucket:
            if smaller not in profiles:
                profiles[smaller] = load_or_measure(target, sparse, context_len, repeats, batch=smaller,
                                                    row_linear=row_linear)
            smaller *= 2
    return profiles[bucket]
