"""`make demo` / `python -m specdec.family.demo`: one code prompt completed by every strategy.

Builds the embedded default model family first when it is missing (a few minutes, once), or
uses the models you point it at:

    python -m specdec.family.demo                                   # the default family (cached)
    python -m specdec.family.demo --models MODELS/pycode  # DIR/target, DIR/draft (DIR/heads, DIR/eagle)
    python -m specdec.family.demo --target T --draft D --heads H --eagle E   # any Hugging Face checkpoints
    SPECDEC_DEMO_MODELS=DIR SPECDEC_DEMO_HEADS=H SPECDEC_DEMO_EAGLE=E make demo   # the same, from the environment

Prints the completion once and a table: tokens/s, tokens per target forward, speed-up over
`autoregressive` and whether the tokens are identical to the target's own greedy
`generate(do_sample=False)` (they must be; the exit status is 1 if any row differs).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec.log import log_to_stderr

STRATEGIES = ("autoregressive", "draft_model", "medusa", "eagle", "prompt_lookup", "token_recycling", "auto")
DEFAULT_ORIGIN = "default family"

# Ends mid-line: a prompt ending in a bare newline splits a whitespace token the tokenizer
# never splits in training, and small models then continue with blank lines.
DEFAULT_PROMPT = '''import os
import sys


def read_lines(path):
    """Return the lines of the file at path, without their line endings."""
    with open(path) as f:
        return [line.rstrip("\\n") for line in f]


def count_words(path):
    """Return a dict mapping each word in the file at path to its number of occurrences."""
    counts = {}
    for line in read_lines(path):
        for word in line.split():
            counts[word] = counts.get(word, 0) + 1
    return counts


def main(argv):
    """Print the most common words of each file named in argv."""
    for path in argv'''


@dataclass(frozen=True)
class DemoModels:
    target: str
    draft: str | None
    heads: str | None
    origin: str                       # where they came from, for the header line
    eagle: str | None = None          # an EAGLE drafter folder for the target


@dataclass
class Row:
    strategy: str
    new_tokens: int
    seconds: float
    target_forwards: int
    identical: bool
    speedup: float = 1.0
    # per verify step, medians over the timed runs (out.stats): milliseconds drafting and verifying, tree nodes
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    nodes: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0


@dataclass
class DemoResult:
    models: DemoModels
    prompt: str
    completion: str                   # the target's own greedy completion
    reference_ids: list[int]
    hf_seconds: float = 0.0           # HF generate(do_sample=False), for reference (median)
    repeats: int = 0                  # timed runs per row
    rows: list[Row] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)    # strategy -> why

    @property
    def all_identical(self) -> bool:
        return bool(self.rows) and all(row.identical for row in self.rows)


# ---------------------------------------------------------------------- which models
def choose_models(target: str | None = None, draft: str | None = None, heads: str | None = None,
                  models_dir: str | None = None, family_config: str | None = None,
                  family_overrides: list[str] | None = None, eagle: str | None = None) -> DemoModels:
    """Explicit paths > a family folder (DIR/target, DIR/draft, DIR/heads, DIR/eagle) > the default family."""
    models_dir = models_dir or os.environ.get("SPECDEC_DEMO_MODELS") or None
    heads = heads or os.environ.get("SPECDEC_DEMO_HEADS") or None
    eagle = eagle or os.environ.get("SPECDEC_DEMO_EAGLE") or None
    if target is None and models_dir is not None:
        if not os.path.isdir(os.path.join(models_dir, "target")):
            from specdec.errors import ModelLoadError
            raise ModelLoadError(f"--models {models_dir!r} has no target/ folder: give a folder holding "
                                 f"target/ (and draft/, heads/), or --target PATH")
        target = os.path.join(models_dir, "target")
        draft = draft or _existing(os.path.join(models_dir, "draft"))
        heads = heads or _existing(os.path.join(models_dir, "heads"))
        eagle = eagle or _existing(os.path.join(models_dir, "eagle"))
        return DemoModels(target, draft, heads, origin=models_dir, eagle=eagle)
    if target is not None:
        return DemoModels(target, draft, heads, origin="given paths", eagle=eagle)
    from . import ensure_family, load_family_config
    from .defaults import default_family_config_name
    family = ensure_family(load_family_config(family_config or default_family_config_name(), family_overrides))
    return DemoModels(family.target, draft or family.draft, heads or family.heads,
                      origin=f"{DEFAULT_ORIGIN} {family.folder}", eagle=eagle or family.eagle)


def _existing(path: str) -> str | None:
    return path if os.path.isdir(path) else None


def unavailable_reason(strategy: str, models: DemoModels) -> str | None:
    """Why a row cannot run here (module not written yet, no draft, no heads), or None."""
    from specdec.config import find_config_file
    from specdec.errors import ConfigError
    from specdec.strategies import REGISTRY
    if importlib.util.find_spec(REGISTRY[strategy]) is None:
        return f"module {REGISTRY[strategy]} is not available in this checkout"
    try:
        find_config_file(strategy)
    except ConfigError:
        return f"no configs/{strategy}.yaml"
    if strategy == "draft_model" and models.draft is None:
        return "no draft model: pass --draft PATH"
    if strategy == "medusa" and models.heads is None:
        return "no Medusa heads for this target: train them with `specdec train-heads`, then pass --heads PATH"
    if strategy == "eagle" and models.eagle is None:
        return ("no EAGLE drafter for this target: train one with `specdec train-heads train_eagle`, "
                "then pass --eagle PATH")
    return None


# ---------------------------------------------------------------------- running
@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding; EOS does not stop it (as ignore_eos=True)."""
    input_ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def load_overrides(strategy: str, models: DemoModels, device: str) -> dict:
    """The dotted overrides of specdec.load for one row."""
    overrides = {"target.path": models.target, "device": device}
    if strategy == "draft_model":
        overrides["draft.path"] = models.draft
    if strategy == "medusa":
        overrides["heads.path"] = models.heads
    if strategy == "eagle":
        overrides["eagle.path"] = models.eagle
    if strategy == "auto":            # prompt lookup plus the drafter specdec.load("auto") picks among these
        overrides.update({key: path for key, path in (("draft.path", models.draft), ("heads.path", models.heads),
                                                      ("eagle.path", models.eagle)) if path is not None})
    return overrides


def run_demo(models: DemoModels, prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 128,
             strategies=STRATEGIES, device: str = "cpu", repeats: int = 3, log=print,
             variants: dict[str, tuple[str, dict]] | None = None) -> DemoResult:
    """Each strategy through the public API (specdec.load): its output (from the warm-up call) is
    compared with the target's own greedy generate(), then the rows are timed `repeats` times in
    turn and each keeps its median time. variants: rows the demo does not show, by label (a name in
    `strategies`) -> (strategy, overrides added to its own), e.g. scripts/measure/demo_rows.py's."""
    import specdec
    from specdec.errors import IncompatibleModelsError, ModelLoadError
    result: DemoResult | None = None
    skipped: dict[str, str] = {}
    loaded = []                       # one Speculator per row that runs
    for name in strategies:
        strategy, extra = (variants or {}).get(name, (name, {}))
        reason = unavailable_reason(strategy, models)
        if reason is not None:
            skipped[name] = reason
            log(f"skipping {name}: {reason}")
            continue
        log(f"running {name} ...")
        try:
            sd = specdec.load(strategy, **load_overrides(strategy, models, device), **extra)
        except (ModelLoadError, IncompatibleModelsError, ImportError) as exc:
            if name == strategies[0]:
                raise
            skipped[name] = f"{type(exc).__name__}: {exc}"     # e.g. heads trained for another target
            log(f"skipping {name}: {exc}")
            continue
        if result is None:   # the reference: the target's own greedy decoding
            result_prompt_ids = sd.tokenizer(prompt)["input_ids"]
            reference = hf_greedy(sd.target, result_prompt_ids, max_new_tokens)    # also its warm-up
            result = DemoResult(models, prompt, sd.tokenizer.decode(reference, skip_special_tokens=True),
                                reference)
        out = sd.generate(prompt, max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)  # warm-up
        result.rows.append(Row(name, out.stats.new_tokens, 0.0, out.stats.target_forwards,
                               identical=out.token_ids == result.reference_ids))
        loaded.append(sd)
    if result is None:
        raise RuntimeError(f"no strategy could run: {skipped}")
    # timing: rounds over all rows in turn (a busy machine slows every row alike), median per row
    calls = [lambda sd=sd: sd.generate(prompt, max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
             for sd in loaded]
    calls.append(lambda: hf_greedy(loaded[0].target, result_prompt_ids, max_new_tokens))
    times: list[list[float]] = [[] for _ in calls]
    steps: list[list[tuple[float, float, float]]] = [[] for _ in result.rows]   # (draft ms, verify ms, nodes)
    for _ in range(repeats):
        for index, call in enumerate(calls):
            out, seconds = _timed(call)
            times[index].append(seconds)
            if index < len(result.rows):          # every timed output is checked too
                result.rows[index].identical &= out.token_ids == result.reference_ids
                split = out.stats.step_split()
                steps[index].append((split.draft_ms, split.verify_ms, split.nodes))
    for row, row_times, row_steps in zip(result.rows, times, steps):
        row.seconds = statistics.median(row_times)
        if row_steps:
            row.draft_ms, row.verify_ms, row.nodes = (statistics.median(column) for column in zip(*row_steps))
    result.hf_seconds = statistics.median(times[-1])
    result.repeats = repeats
    result.skipped = skipped
    base = next((r for r in result.rows if r.strategy == "autoregressive"), None)
    for row in result.rows:
        row.speedup = (row.tokens_per_second / base.tokens_per_second
                       if base is not None and base.tokens_per_second else float("nan"))
    return result


# ---------------------------------------------------------------------- output
def render(result: DemoResult, console: Console) -> None:
    console.rule("[bold]prompt[/bold] (dim) + [bold]completion[/bold] (identical for every strategy below)")
    console.print(Text(result.prompt, style="dim") + Text(result.completion, style="bold cyan"))
    console.rule()
    table = Table(title=f"{len(result.reference_ids)} new tokens, greedy, on {result.models.origin}")
    for column, justify in (("strategy", "left"), ("tokens/s", "right"), ("tokens / target forward", "right"),
                            ("speed-up vs autoregressive", "right"), ("same as greedy", "center")):
        # a strategy's name is never cut (token_recycling is the longest): the numbers' headers wrap instead
        table.add_column(column, justify=justify, no_wrap=column == "strategy",
                         min_width=len("autoregressive") if column.startswith("speed-up") else None)
    for row in result.rows:
        table.add_row(row.strategy, f"{row.tokens_per_second:.1f}", f"{row.tokens_per_forward:.2f}",
                      f"{row.speedup:.2f}x", "[green]yes[/green]" if row.identical else "[red bold]NO[/red bold]")
    for name, reason in result.skipped.items():
        table.add_row(name, "-", "-", "-", "skipped")
    hf_rate = len(result.reference_ids) / result.hf_seconds if result.hf_seconds else 0.0
    table.caption = (f"reference: Hugging Face generate(do_sample=False) on the same target, "
                     f"{hf_rate:.1f} tokens/s. {torch.get_num_threads()} torch thread(s). Median of {result.repeats} timed "
                     f"runs per row (rows in turn), after a "
                     f"warm-up; ratios are the figures to read, absolute speeds vary from run to run.")
    console.print(table)
    for name, reason in result.skipped.items():
        console.print(f"[yellow]{name} skipped[/yellow]: {reason}")


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m specdec.family.demo", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="folder holding target/ and draft/ (and heads/); env SPECDEC_DEMO_MODELS")
    parser.add_argument("--target", help="target checkpoint folder (replaces the default target)")
    parser.add_argument("--draft", help="draft checkpoint folder (same tokenizer as the target)")
    parser.add_argument("--heads", help="Medusa heads folder for the target; env SPECDEC_DEMO_HEADS")
    parser.add_argument("--eagle", help="EAGLE drafter folder for the target; env SPECDEC_DEMO_EAGLE")
    parser.add_argument("--prompt", help="the prompt (default: a small Python function to finish)")
    parser.add_argument("--prompt-file", help="read the prompt from this file")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated rows, autoregressive first (default: {','.join(STRATEGIES)})")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per row, in turn (median kept)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto (default: cpu)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads while timing (0 = torch's default; default: 1 for the tiny "
                             "default family, whose small matrix products only pay thread hand-offs, "
                             "torch's default for other models)")
    parser.add_argument("--family-config", help="YAML of the default family to build (sizes, budget); "
                                                "default configs/default_family.yaml or $SPECDEC_FAMILY_CONFIG")
    parser.add_argument("--family-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the family config, e.g. target.train.steps=50 (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from specdec.errors import SpecDecError
    log_to_stderr()                  # the family build's progress
    args = parse_args(argv)
    console = Console()
    prompt = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies or strategies[0] != "autoregressive":
        console.print(f"[red]--strategies must start with autoregressive (the baseline) and use only "
                      f"{', '.join(STRATEGIES)}; got {args.strategies!r}[/red]")
        return 2
    try:
        models = choose_models(args.target, args.draft, args.heads, args.models, args.family_config,
                               args.family_set, args.eagle)
        threads = args.threads if args.threads is not None else (1 if models.origin.startswith(DEFAULT_ORIGIN) else 0)
        if threads:
            torch.set_num_threads(threads)
        result = run_demo(models, prompt, args.max_new_tokens, strategies, args.device, max(1, args.repeats),
                          log=lambda msg: console.print(f"[dim]{msg}[/dim]"))
    except SpecDecError as exc:
        console.print(f"[red]demo: error:[/red] {exc}")
        return 2
    render(result, console)
    if not result.all_identical:
        console.print("[red bold]a strategy's output differs from greedy decoding: this is a bug, please report it[/red bold]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
