"""`specdec check`: does speculative decoding stay lossless on *your* model, and does it pay?

Three checks on a loaded Speculator:
  (a) greedy identity: the tokens equal the target's own generate(do_sample=False) (EOS off), per
      prompt; a divergence is reported with its position and whether it is a numerical tie (the
      target's logits of the two tokens there differ by no more than the dtype's resolution);
  (b) sampling law: the first two sampled tokens (top-k, temperature 1, many seeded runs) against
      their exact law computed from the target's own distributions, by a chi-square test;
  (c) tokens per target forward and speed-up over autoregressive generate() on this machine.
Python: `specdec.check.check(speculator, prompts)` -> CheckReport; CLI: `specdec check <config> ...`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from .errors import InputError, SpecDecError
from .sampling import SamplingParams, logits_to_probs

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "The quick brown fox",
    "for i in range(10):\n    ",
)
ALPHA = 0.01            # chi-square: fail when p < ALPHA
TIE_ULPS = 4            # a divergence is a tie when the two logits are within 4 dtype epsilons (relative)
MIN_EXPECTED = 5.0      # chi-square cells expecting fewer counts are pooled


# ---------------------------------------------------------------------- results
@dataclass
class IdentityResult:
    prompt: str
    new_tokens: int
    divergence: int | None = None      # first position where the tokens differ (None: identical)
    logit_gap: float | None = None     # |target logit of our token - of generate()'s token| there
    resolution: float | None = None    # the dtype's resolution at those logits
    tie: bool | None = None            # logit_gap <= resolution: a numerical tie, not a bug

    @property
    def passed(self) -> bool:
        return self.divergence is None or bool(self.tie)


@dataclass
class LawResult:
    prompt: str
    runs: int
    top_k: int
    statistic: float
    dof: int
    p_value: float
    alpha: float
    impossible: int                    # runs whose first two tokens have exact probability 0

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.p_value >= self.alpha


@dataclass
class SpeedResult:
    new_tokens: int
    target_forwards: int
    speculative_s: float
    autoregressive_s: float

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def speedup(self) -> float:
        return self.autoregressive_s / self.speculative_s if self.speculative_s else 0.0


@dataclass
class CheckReport:
    strategy: str
    device: str
    dtype: str
    identity: list[IdentityResult] = field(default_factory=list)
    law: LawResult | None = None
    speed: SpeedResult | None = None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.identity) and (self.law is None or self.law.passed)


# ---------------------------------------------------------------------- (a) greedy identity
def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own generate(do_sample=False), EOS off, plain greedy (no penalties): new tokens."""
    ids = torch.tensor([prompt_ids], device=model.device)
    pad = getattr(model.generation_config, "pad_token_id", None)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         min_new_tokens=0, do_sample=False, num_beams=1, eos_token_id=None,
                         pad_token_id=0 if pad is None else pad, repetition_penalty=1.0,
                         no_repeat_ngram_size=0, suppress_tokens=None, begin_suppress_tokens=None,
                         forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None)
    return out[0, len(prompt_ids):].tolist()


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


@torch.inference_mode()
def tie_at(model, context: list[int], token_a: int, token_b: int) -> tuple[float, float]:
    """(|logit a - logit b|, resolution) of the target's next-token logits after `context`, in the
    model's dtype: the resolution is TIE_ULPS epsilons of that dtype relative to the logits' size."""
    logits = model(torch.tensor([context], device=model.device)).logits[0, -1]      # [V], model dtype
    a, b = logits[token_a].float().item(), logits[token_b].float().item()
    eps = torch.finfo(logits.dtype).eps
    return abs(a - b), TIE_ULPS * eps * max(1.0, abs(a), abs(b))


def greedy_identity(speculator, prompt_ids: list[int], label: str, max_new_tokens: int):
    """(IdentityResult, speculative stats, speculative seconds, autoregressive seconds)."""
    t0 = time.perf_counter()
    ours = speculator.generate(prompt_ids, max_new_tokens=max_new_tokens, ignore_eos=True)
    t1 = time.perf_counter()
    theirs = reference_greedy(speculator.target, prompt_ids, max_new_tokens)
    t2 = time.perf_counter()
    result = IdentityResult(label, len(ours.token_ids))
    at = first_divergence(ours.token_ids, theirs)
    if at is not None:
        result.divergence = at
        if at < min(len(ours.token_ids), len(theirs)):
            gap, resolution = tie_at(speculator.target, prompt_ids + theirs[:at], ours.token_ids[at], theirs[at])
            result.logit_gap, result.resolution, result.tie = gap, resolution, gap <= resolution
        else:
            result.tie = False                                         # a length mismatch is never a tie
    return result, ours.stats, t1 - t0, t2 - t1


# ---------------------------------------------------------------------- (b) sampling law
@torch.inference_mode()
def exact_first_two(model, prompt_ids: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    """Exact law of the first two sampled tokens from the target's own warped distributions."""
    def probs(ids):
        logits = model(torch.tensor([ids], device=model.device)).logits[0, -1]       # [V]
        return logits_to_probs(logits, params).double().cpu()
    law = {}
    first = probs(prompt_ids)                                                          # [V]
    for t1 in torch.nonzero(first).flatten().tolist():
        second = probs(prompt_ids + [t1])
        for t2 in torch.nonzero(second).flatten().tolist():
            law[(t1, t2)] = float(first[t1] * second[t2])
    return law


def chi_square_p_value(statistic: float, dof: int) -> float:
    """P(chi2_dof >= statistic): the regularized upper incomplete gamma Q(dof / 2, statistic / 2)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def chi_square(counts: Counter, law: dict, runs: int) -> tuple[float, int, float, int]:
    """(statistic, degrees of freedom, p-value, impossible runs): Pearson's test of the observed
    counts against runs x law; cells expecting < MIN_EXPECTED are pooled into one."""
    impossible = sum(n for outcome, n in counts.items() if law.get(outcome, 0.0) <= 0)
    cells, pooled_expected, pooled_observed = [], 0.0, 0
    for outcome, p in law.items():
        expected = runs * p
        if expected < MIN_EXPECTED:
            pooled_expected += expected
            pooled_observed += counts.get(outcome, 0)
        else:
            cells.append([expected, counts.get(outcome, 0)])
    pooled_observed += impossible
    if pooled_expected > 0 or pooled_observed:
        if pooled_expected >= MIN_EXPECTED or not cells:
            cells.append([pooled_expected, pooled_observed])
        else:                                        # too small alone: fold into the smallest cell
            smallest = min(cells, key=lambda c: c[0])
            smallest[0] += pooled_expected
            smallest[1] += pooled_observed
    statistic = sum((o - e) ** 2 / e for e, o in cells if e > 0)
    dof = len(cells) - 1
    return statistic, dof, chi_square_p_value(statistic, dof), impossible


def sampling_law(speculator, prompt_ids: list[int], label: str, runs: int, top_k: int = 3,
                 alpha: float = ALPHA, sample_tokens: int = 8) -> LawResult:
    """Sample with seeds 0..runs-1 (temperature 1, top-k) and test the law of the first two tokens
    against the target's exact law. Odd seeds sample `sample_tokens` tokens (the first two come
    from deep drafts: acceptance and correction), even seeds 2 (a one-token draft: the second is
    the bonus token after it, or a correction); the law of the first two is the same for both."""
    if sample_tokens < 2:
        raise InputError(f"the sampling check needs at least 2 sampled tokens per run, got {sample_tokens}")
    params = SamplingParams(1.0, top_k=top_k)
    counts: Counter = Counter()
    for seed in range(runs):
        out = speculator.generate(prompt_ids, max_new_tokens=sample_tokens if seed % 2 else 2,
                                  temperature=1.0, top_k=top_k,
                                  seed=seed, ignore_eos=True)
        counts[tuple(out.token_ids[:2])] += 1
    law = exact_first_two(speculator.target, prompt_ids, params)
    statistic, dof, p_value, impossible = chi_square(counts, law, runs)
    return LawResult(label, runs, top_k, statistic, dof, p_value, alpha, impossible)


# ---------------------------------------------------------------------- all three
def _prompts(speculator, prompts) -> list[tuple[list[int], str]]:
    """(token ids, label) per prompt; text needs the speculator's tokenizer."""
    if prompts is None:
        if speculator.tokenizer is None:
            raise InputError("the built-in prompts are text and need a tokenizer: pass prompts as token ids")
        prompts = DEFAULT_PROMPTS
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not prompts:
        raise InputError("no prompts to check: give at least one (or none for the built-in ones)")
    out = []
    for prompt in prompts:
        if isinstance(prompt, str):
            if speculator.tokenizer is None:
                raise InputError("text prompts need a tokenizer: pass token ids instead")
            ids = speculator.tokenizer(prompt)["input_ids"]
            label = prompt
        else:
            ids, label = list(prompt), " ".join(map(str, list(prompt)[:12])) + (" ..." if len(prompt) > 12 else "")
        if not ids:
            raise InputError(f"prompt {label!r} has no tokens")
        out.append((ids, label))
    return out


def check(speculator, prompts=None, *, max_new_tokens: int = 32, runs: int = 300, top_k: int = 3,
          alpha: float = ALPHA, sample_tokens: int = 8, sampling: bool = True, speed: bool = True,
          progress=None) -> CheckReport:
    """Run the checks on `speculator` (a specdec.Speculator). prompts: texts or token-id lists
    (None: built-in short prompts); the sampling check uses the first one. `progress(message)`
    is called before each stage."""
    note = progress or (lambda message: None)
    items = _prompts(speculator, prompts)
    target = speculator.target
    report = CheckReport(strategy=speculator.strategy.name,
                         device=str(target.device), dtype=str(target.dtype).replace("torch.", ""))
    if speed:   # warm up both paths once so the timings below do not include first-call costs
        speculator.generate(items[0][0], max_new_tokens=4, ignore_eos=True)
        reference_greedy(target, items[0][0], 4)
    totals = SpeedResult(0, 0, 0.0, 0.0)
    for ids, label in items:
        note(f"greedy identity: {label[:40]!r}")
        result, stats, ours_s, theirs_s = greedy_identity(speculator, ids, label, max_new_tokens)
        report.identity.append(result)
        totals.new_tokens += stats.new_tokens
        totals.target_forwards += stats.target_forwards
        totals.speculative_s += ours_s
        totals.autoregressive_s += theirs_s
    if speed:
        report.speed = totals
    if sampling and runs > 0:
        ids, label = items[0]
        note(f"sampling law: {runs} seeded runs, top_k={top_k}")
        report.law = sampling_law(speculator, ids, label, runs, top_k, alpha, sample_tokens)
    return report


# ---------------------------------------------------------------------- report
def print_report(report: CheckReport, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    ok = {True: "[green]pass[/green]", False: "[red]FAIL[/red]"}

    table = Table(title=f"(a) greedy identity vs the target's generate(do_sample=False) "
                        f"[{report.strategy}, {report.device}, {report.dtype}]")
    table.add_column("prompt")
    table.add_column("new tokens", justify="right")
    table.add_column("result")
    table.add_column("verdict")
    for r in report.identity:
        if r.divergence is None:
            result = "identical"
        elif r.logit_gap is None:
            result = f"lengths differ from position {r.divergence}"
        else:
            kind = "numerical tie" if r.tie else "NOT a tie"
            result = (f"diverges at token {r.divergence}: {kind} "
                      f"(logit gap {r.logit_gap:.3g}, {report.dtype} resolution {r.resolution:.3g})")
        table.add_row(repr(r.prompt[:32]), str(r.new_tokens), result, ok[r.passed])
    console.print(table)

    if report.law is not None:
        law = report.law
        table = Table(title=f"(b) law of the first two sampled tokens (temperature 1, top_k={law.top_k}) "
                            f"vs the target's exact law: chi-square")
        for name in ("runs", "statistic", "dof", "p-value", "alpha", "impossible", "verdict"):
            table.add_column(name, justify="right")
        table.add_row(str(law.runs), f"{law.statistic:.2f}", str(law.dof), f"{law.p_value:.3g}",
                      str(law.alpha), str(law.impossible), ok[law.passed])
        console.print(table)

    if report.speed is not None:
        s = report.speed
        table = Table(title=f"(c) speed on this machine (greedy, the identity prompts, "
                            f"{torch.get_num_threads()} torch threads)")
        for name in ("new tokens", "target forwards", "tokens / forward", "speculative s",
                     "autoregressive s", "speed-up"):
            table.add_column(name, justify="right")
        table.add_row(str(s.new_tokens), str(s.target_forwards), f"{s.tokens_per_forward:.2f}",
                      f"{s.speculative_s:.2f}", f"{s.autoregressive_s:.2f}", f"{s.speedup:.2f}x")
        console.print(table)
    console.print("check " + ("[green]PASSED[/green]" if report.passed else "[red]FAILED[/red]"))


# ---------------------------------------------------------------------- CLI
def _read_prompts(path: str) -> list[str]:
    """A .json file holds a list of strings; any other file holds one prompt per non-empty line."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InputError(f"cannot read --prompts-file {path!r}: {exc}") from exc
    if path.endswith(".json"):
        prompts = json.loads(text)
        if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)):
            raise InputError(f"{path} must hold a JSON list of prompt strings")
        return prompts
    return [line for line in text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec check", description=(
        "Check that speculative decoding is lossless on your model (greedy identity against its own "
        "generate(), chi-square test of the sampling law) and measure its speed-up. Exit status 1 "
        "when a check fails."))
    parser.add_argument("config", help="a shipped config name (draft_model, prompt_lookup, medusa, ...) or a YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. target.path=... draft.path=...")
    parser.add_argument("--prompt", action="append", help="a prompt to check (repeatable; default: built-in prompts)")
    parser.add_argument("--prompts-file", help="prompts, one per line (or a .json list of strings)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    parser.add_argument("--runs", type=int, default=300, help="seeded sampling runs (default 300; 0 skips the test)")
    parser.add_argument("--top-k", type=int, default=3, help="top-k of the sampling test (default 3)")
    parser.add_argument("--sample-tokens", type=int, default=8,
                        help="tokens per sampling run (default 8: the first two come from speculated runs)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help=f"chi-square significance level (default {ALPHA})")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (1 is steadier on a busy CPU)")
    parser.add_argument("--no-speed", action="store_true", help="skip the warm-up and the speed table")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from .loading import load
        overrides = {}
        for o in args.overrides:
            if "=" not in o:
                raise InputError(f"override {o!r} is not of the form key=value (e.g. draft.path=...)")
            key, value = o.split("=", 1)
            overrides[key] = value
        prompts = list(args.prompt or [])
        if args.prompts_file:
            prompts += _read_prompts(args.prompts_file)
        from rich.console import Console
        console = Console()
        speculator = load(args.config, **overrides)
        report = check(speculator, prompts or None, max_new_tokens=args.max_new_tokens, runs=args.runs,
                       top_k=args.top_k, alpha=args.alpha, sample_tokens=args.sample_tokens,
                       speed=not args.no_speed,
                       progress=lambda message: console.print(f"[dim]... {message}[/dim]"))
    except SpecDecError as exc:
        print(f"specdec check: error: {exc}", file=sys.stderr)
        return 2
    print_report(report, console)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
