"""mtp: the target's own multi-token-prediction modules draft (DeepSeek-V3/R1, GLM-4.5, Qwen3-Next, Qwen3.5;
Hugging Face's `generate(use_mtp=True)`, vLLM's `deepseek_mtp` and `qwen3_next_mtp`, SGLang's NEXTN).

The modules are read from the target's checkpoint (specdec.heads.mtp.load_mtp), or, with `mtp.path`,
from a folder of modules trained apart for a target that ships none (`specdec train mtp`), and driven as an EAGLE
drafter is (strategies/eagle.py): the module keeps a KV cache of the committed rows (row t: the target's
last hidden state at t and token t + 1), the tree hangs off the last committed row, and with one module deeper
levels feed it its own output, module 0 at every depth (vLLM's way). With several, module k drafts depth k
as Hugging Face's MtpModel chains them, each module with a cache of its own (strategies/mtp_modules.py),
and the last one goes on past them. Chains and trees, greedy, the coupled sampler and lossless
sampled trees all come from the eagle strategy; rows of a batch draft one after another.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specdec.config import setting
from specdec.errors import IncompatibleModelsError
from specdec.tree import CandidateTree
from specdec.types import DecodeState

from .eagle import Eagle
from .mtp_modules import DeeperModules


@dataclass
class MtpConfig:
    """The `mtp:` section. Defaults: a chain of 3 (top_k 1), as vLLM serves one MTP module."""
    path: Optional[str] = None              # folder of modules trained apart (`specdec train mtp`: mtp.json +
    #                                         mtp.safetensors); null: the target checkpoint's own
    depth: int = setting(3, min=1)          # drafted levels at most
    top_k: int = setting(1, min=1)          # children considered per node (1: a chain)
    max_nodes: int = setting(3, min=1)      # tree node budget
    sampled_depth: int = setting(3, min=1)  # sampling (rejection): levels
    sampled_top_k: int = setting(1, min=1)  # sampling (rejection): nodes per level


CONFIG_SECTIONS = {"mtp": MtpConfig}


class Mtp(Eagle):
    name = "mtp"

    def __init__(self, drafter, depth: int = MtpConfig.depth, top_k: int = MtpConfig.top_k,
                 max_nodes: int = MtpConfig.max_nodes, sampled_depth: int = MtpConfig.sampled_depth,
                 sampled_top_k: int = MtpConfig.sampled_top_k):
        self.modules = int(drafter.layout.modules)
        super().__init__(drafter, max_nodes=max_nodes, top_k=top_k, depth=depth, stop_below=0.0,
                         sampled_top_k=sampled_top_k, sampled_depth=sampled_depth, score_temperature=1.0,
                         batch_rows=False, table_chain=0)

    def bind(self, target, tokenizer) -> None:
        if self.drafter.target_id != id(target):
            raise IncompatibleModelsError("mtp: these MTP modules were read for another target object: read them "
                                          "for this one (Mtp.for_target(target))")
        self.device = target.device

    def reset_cache(self) -> None:
        super().reset_cache()
        # modules 1 .. n - 1 draft the levels below the first, each with a cache of its own
        self.deeper = DeeperModules(self.drafter, self.modules, self.device, self.tables, self.kv) \
            if self.modules > 1 else None

    def rows_fed(self, first_row: int, out: torch.Tensor) -> None:
        if self.deeper is not None:
            self.deeper.module_zero_fed(first_row, out)

    def catch_up(self, token_ids: list[int]):
        root = super().catch_up(token_ids)
        if self.deeper is not None:
            self.deeper.catch_up(token_ids)
        return root

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> CandidateTree:
        if self.deeper is not None:
            self.catch_up(state.token_ids)
            if not self.deeper.ready(len(state.token_ids) - 1):     # a context shorter than the modules
                return CandidateTree.empty(self.device)
        return super().propose(state)

    def _feed(self, tree, nodes: list[int], tokens: torch.Tensor, depth: int):
        if self.deeper is None:
            return super()._feed(tree, nodes, tokens, depth)
        return self.deeper.feed(tree, nodes, tokens, depth, self.fed)

    @classmethod
    def for_target(cls, target, folder: str | None = None, modules: str | None = None, **settings) -> "Mtp":
        """The strategy over the MTP modules of `target`'s checkpoint (`folder`: default, where it was loaded
        from), or over the modules trained apart for it in the folder `modules`."""
        from specdec.heads.mtp import MtpDrafter, load_mtp
        return cls(MtpDrafter(load_mtp(target, folder, modules), id(target)), **settings)

    def drafting_modules(self) -> list[torch.nn.Module]:
        return [self.drafter]


def from_config(cfg, target, tokenizer, device, dtype) -> Mtp:
    m = cfg.mtp
    return Mtp.for_target(target, cfg.target.path, m.path, depth=m.depth, top_k=m.top_k, max_nodes=m.max_nodes,
                          sampled_depth=m.sampled_depth, sampled_top_k=m.sampled_top_k)
