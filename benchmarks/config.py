"""The bench config: a dataclass schema (OmegaConf structured config), a YAML preset in
configs/bench/ and `key=value` overrides on the command line."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING, OmegaConf

from specdec.config import build_config
from specdec.errors import ConfigError

PROMPT_SETS = ("code", "grounded", "noise", "samples", "jsonl")
PEER_KINDS = ("plain", "assistant", "prompt_lookup", "early_exit")
NEEDS = ("draft", "heads", "eagle", "datastore")


@dataclass
class ModelsConfig:
    dir: Optional[str] = None           # a family folder: DIR/target, and DIR/draft, DIR/heads, DIR/eagle,
    #                                     DIR/tokenizer, DIR/split.json where present (what make demo --models takes)
    target: Optional[str] = None        # HF checkpoint folder; None = models.dir's, else the embedded default family
    draft: Optional[str] = None         # draft checkpoint (draft_model rows, HF assistant rows)
    heads: Optional[str] = None         # Medusa heads folder (medusa rows are skipped without it)
    eagle: Optional[str] = None         # EAGLE drafter folder (eagle rows are skipped without it)
    datastore: Optional[str] = None     # REST datastore folder, `specdec index` (rest rows are skipped without it)
    tokenizer: Optional[str] = None     # tokenizer folder when it is not beside the target weights
    device: str = "cpu"                 # cpu | cuda | cuda:N | auto
    dtype: str = "float32"              # float32 | float16 | bfloat16 | auto


@dataclass
class StrategyEntry:
    label: str = MISSING                # the row's name in tables and plots
    config: str = MISSING               # a shipped specdec config name or a YAML path
    overrides: List[str] = field(default_factory=list)    # dotted key=value, e.g. draft.num_tokens=6
    needs: List[str] = field(default_factory=list)        # "draft" / "heads" / "eagle" / "datastore": skip (with a
    #                                                       note) without them
    sweep: Optional[str] = None         # sweep group, e.g. "draft length"; rows of a group are plotted together
    sweep_value: Optional[float] = None  # the x value of this row in its sweep (γ, tree size, ...)


@dataclass
class PeerEntry:
    label: str = MISSING
    kind: str = MISSING                 # plain | assistant | prompt_lookup | early_exit
    num_assistant_tokens: Optional[int] = None            # assistant: None = HF's default schedule
    num_assistant_tokens_schedule: Optional[str] = None   # constant | heuristic | heuristic_transient
    assistant_confidence_threshold: Optional[float] = None
    prompt_lookup_num_tokens: Optional[int] = None
    assistant_early_exit: Optional[int] = None   # early_exit: the exit layer (the target drafts with its first layers)
    max_matching_ngram_size: Optional[int] = None


@dataclass
class PromptsConfig:
    sets: List[str] = field(default_factory=lambda: ["code", "grounded"])
    num: int = 8                        # prompts per set
    tokens: int = 384                   # prompt length in target tokens (code, grounded, noise)
    seed: int = 0
    split: Optional[str] = None         # JSON with a "heldout" list of files (relative to source_dir)
    source_dir: Optional[str] = None    # folder of .py files; None = this Python's standard library
    heldout_fraction: float = 0.05      # seeded split of source_dir when no split file is given
    jsonl: Optional[str] = None         # the jsonl set: one {"prompt": "..."} per line
    samples: int = 8                    # samples set: sampled requests per prompt (seeds 0 .. samples - 1)
    samples_temperature: float = 0.8    # samples set: their temperature (then one greedy edited request)


@dataclass
class BenchConfig:
    name: str = "bench"
    models: ModelsConfig = field(default_factory=ModelsConfig)
    strategies: List[StrategyEntry] = field(default_factory=list)
    peers: List[PeerEntry] = field(default_factory=list)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    temperatures: List[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: int = 128
    seeds: List[int] = field(default_factory=lambda: [0])   # sampling seeds (temperature 0 uses the first)
    repeats: int = 1                    # timed generations per (row, prompt, temperature, seed); batch presets:
    #                                     rounds over the rows at each batch size, each row's median rate kept
    warmup_tokens: int = 16             # one untimed warm-up generation per row and temperature; 0 = none
    only: List[str] = field(default_factory=list)   # keep rows whose label contains one of these
    output_dir: str = "bench_out/${name}"
    write_readme: bool = False          # rewrite this preset's marked section of benchmarks/README.md
    readme: Optional[str] = None        # another README to rewrite (default: benchmarks/README.md)
    progress: bool = True
    threads: Optional[int] = None       # torch.set_num_threads; None = torch's default (1 helps on a busy machine)
    questions: Optional[str] = None     # a Spec-Bench question file: every row answers its questions turn by turn
    #                                     and writes output_dir/model_answer/<model id>.jsonl (benchmarks/specbench.py)
    model_id: Optional[str] = None      # the model part of those ids; None = the family's (or target folder's) name
    batch_sizes: List[int] = field(default_factory=list)   # non-empty: the batch benchmark (benchmarks/batch.py):
    #                                     every prompt at once through generate(list, batch_size=B), per B


def load_bench_config(name_or_path: str, overrides: dict | list | None = None) -> BenchConfig:
    """Schema defaults <- a preset in configs/bench (or a YAML path) <- overrides (config.parse_overrides' dict)."""
    cfg = build_config(BenchConfig, name_or_path, overrides, subdir="bench")
    validate(cfg)
    return cfg


def _one_of(value: str, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        hint = difflib.get_close_matches(value, valid, n=1)
        raise ConfigError(f"{what}={value!r} is not valid" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; use one of: {', '.join(valid)}")


def validate(cfg: BenchConfig) -> None:
    for name in cfg.prompts.sets:
        _one_of(name, PROMPT_SETS, "prompts.sets entry")
    if "jsonl" in cfg.prompts.sets and not cfg.prompts.jsonl:
        raise ConfigError("prompts.sets has 'jsonl' but prompts.jsonl is not set: give prompts.jsonl=/path/to/prompts.jsonl")
    for entry in cfg.peers:
        _one_of(entry.kind, PEER_KINDS, f"peers[{entry.label}].kind")
        if entry.kind == "early_exit" and not entry.assistant_early_exit:
            raise ConfigError(f"peer {entry.label!r} (early_exit) needs assistant_early_exit (the exit layer), e.g. 4")
        if entry.kind == "prompt_lookup" and not entry.prompt_lookup_num_tokens:
            raise ConfigError(f"peer {entry.label!r} (prompt_lookup) needs prompt_lookup_num_tokens, e.g. 10")
    for entry in cfg.strategies:
        for need in entry.needs:
            _one_of(need, NEEDS, f"strategies[{entry.label}].needs entry")
    labels = [e.label for e in cfg.strategies] + [p.label for p in cfg.peers]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ConfigError(f"row labels must be unique; repeated: {', '.join(duplicates)}")
    if cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    if cfg.prompts.num < 1 or cfg.prompts.tokens < 2:
        raise ConfigError(f"need prompts.num >= 1 and prompts.tokens >= 2, got {cfg.prompts.num}, {cfg.prompts.tokens}")
    if cfg.repeats < 1 or not cfg.seeds or not cfg.temperatures:
        raise ConfigError("need repeats >= 1 and at least one seed and one temperature")
    if "samples" in cfg.prompts.sets and (cfg.prompts.samples < 1 or cfg.prompts.samples_temperature <= 0):
        raise ConfigError(f"the samples set needs prompts.samples >= 1 and prompts.samples_temperature > 0, got "
                          f"{cfg.prompts.samples}, {cfg.prompts.samples_temperature}")
    if cfg.questions and cfg.batch_sizes:
        raise ConfigError("questions= and batch_sizes= are two benchmarks (Spec-Bench's answers are one sequence at a "
                          "time): drop one of them")
    if cfg.questions and cfg.repeats != 1:
        raise ConfigError(f"questions= writes one answer per question, as Spec-Bench's answer files hold; got "
                          f"repeats={cfg.repeats}: run again into another output_dir for another run")
    if any(t < 0 for t in cfg.temperatures):
        raise ConfigError(f"temperatures must be >= 0 (0 = greedy), got {list(cfg.temperatures)}")


def as_plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
