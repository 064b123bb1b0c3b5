"""Benchmark rows of our own: one Speculator per strategy entry, all sharing one target model."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf

from specdec.api import Speculator
from specdec.config import load_spec_config
from specdec.strategies import build_strategy

from .generation import Generation, shared_generation_config

NEEDED_BY_STRATEGY = {"draft_model": "draft", "medusa": "heads", "eagle": "eagle", "rest": "datastore"}
WHAT_IS_NEEDED = {"draft": "a draft checkpoint", "heads": "trained Medusa heads", "eagle": "a trained EAGLE drafter",
                  "datastore": "a REST datastore: specdec index FILES... --out DIR --tokenizer TARGET"}
# the config key each need fills (a row's own overrides may set it instead of models.*)
CONFIG_KEY_OF_NEED = {"draft": "draft.path", "heads": "heads.path", "eagle": "eagle.path", "datastore": "rest.datastore"}


@dataclass
class SpecdecRow:
    label: str
    speculator: Speculator
    info: dict = field(default_factory=dict)
    kind: str = "specdec"

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> Generation:
        target = self.speculator.target
        saved = target.generation_config   # run with the generation_config HF's rows use, for this call only
        target.generation_config = shared_generation_config(target)
        try:
            out = self.speculator.generate(prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                           top_k=0, top_p=1.0, seed=seed, ignore_eos=True)
        finally:
            target.generation_config = saved
        return Generation(out.token_ids, out.stats.as_dict(), list(out.stats.accepted_lengths))

    def forget(self) -> None:
        """Drop what the strategy keeps across calls (suffix's cached outputs, also as auto's lookup
        part), so a workload starts from nothing; the cost profile and calibration stay."""
        self.speculator.strategy.forget()

    def modules(self) -> list[torch.nn.Module]:
        """The strategy's own models (draft model, heads): their forwards count as drafting."""
        return [m for m in self.speculator.strategy.drafting_modules() if m is not self.speculator.target]

    def target_parts(self) -> list[torch.nn.Module]:
        """Modules through which the verify runs the target's own layers (early_exit's KV reuse): their
        forwards count as target forwards."""
        return [m for m in self.speculator.strategy.verifying_modules() if m is not self.speculator.target]


def _path_overrides(models) -> list[str]:
    pairs = {"target.path": models.target, "target.tokenizer": models.tokenizer, "draft.path": models.draft,
             "heads.path": models.heads, "eagle.path": models.eagle, "rest.datastore": models.datastore,
             "device": models.device, "dtype": models.dtype}
    return [f"{key}={value}" for key, value in pairs.items() if value is not None]


def build_specdec_rows(entries, models, target, tokenizer, device, dtype, notes: list[str]) -> list[SpecdecRow]:
    """A row per entry; entries whose draft model or heads are not given are skipped with a note."""
    rows = []
    for entry in entries:
        # profile: the time split in the report is the device's own on a GPU (a sync around each part)
        # the row's own overrides last: a row may set a model path of its own (or null one out)
        cfg = load_spec_config(entry.config, _path_overrides(models) + list(entry.overrides) + ["profile=true"])
        needs = list(entry.needs) + ([NEEDED_BY_STRATEGY[cfg.strategy]] if cfg.strategy in NEEDED_BY_STRATEGY else [])
        missing = [need for need in needs if OmegaConf.select(cfg, CONFIG_KEY_OF_NEED[need]) is None]
        if missing:
            notes.append(f"row {entry.label!r} skipped: it needs models.{missing[0]}=PATH "
                         f"({WHAT_IS_NEEDED[missing[0]]})")
            continue
        strategy = build_strategy(cfg, target, tokenizer, device, dtype)
        speculator = Speculator(target, tokenizer, strategy, config=cfg)
        info = {"config": entry.config, "overrides": list(entry.overrides), "strategy": cfg.strategy,
                "sampler": cfg.generation.sampler, "sweep": entry.sweep, "sweep_value": entry.sweep_value}
        rows.append(SpecdecRow(entry.label, speculator, info))
    return rows
