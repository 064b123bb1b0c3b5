"""Hugging Face's own generate() as benchmark rows: plain, with assistant_model= (a draft model),
with assistant_early_exit= (the target's first layers) and with prompt_lookup_num_tokens=, on the same
target object as our rows.

Every row generates exactly max_new_tokens: EOS is switched off with eos_token_id=-1 (an id no
token has), the exact equivalent of our ignore_eos=True. min_new_tokens=max_new_tokens is not
used: it works by setting the EOS logit to -inf, which changes the greedy output wherever EOS is
the argmax. top_k=0, top_p=1 so sampling draws from the same distribution as ours (HF's default
top_k is 50)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf
from transformers import GenerationConfig

from .generation import Generation, shared_generation_config

NO_EOS = -1      # never generated: generation runs to max_new_tokens (HF warns, harmlessly)
ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@dataclass
class HFRow:
    label: str
    target: torch.nn.Module
    entry: object                      # the PeerEntry
    draft: torch.nn.Module | None = None
    info: dict = field(default_factory=dict)
    kind: str = "hf"

    def _generation_config(self, max_new_tokens: int, temperature: float) -> GenerationConfig:
        gc = shared_generation_config(self.target)
        gc.update(max_new_tokens=max_new_tokens, eos_token_id=NO_EOS,
                  do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0,
                  top_k=0 if temperature > 0 else None, top_p=1.0, use_cache=True)
        if gc.pad_token_id is None:
            gc.pad_token_id = 0
        if self.entry.kind == "early_exit":
            gc.assistant_early_exit = self.entry.assistant_early_exit
        if self.entry.kind == "prompt_lookup":
            gc.prompt_lookup_num_tokens = self.entry.prompt_lookup_num_tokens
            if self.entry.max_matching_ngram_size:
                gc.max_matching_ngram_size = self.entry.max_matching_ngram_size
        return gc

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> Generation:
        device = self.target.device
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                      generation_config=self._generation_config(max_new_tokens, temperature))
        # HF reads the schedule from the assistant's own generation config (early exit: the target's)
        assistant = {"assistant": self.draft, "early_exit": self.target}.get(self.entry.kind)
        saved = None
        if assistant is not None:         # set it for this call only
            saved = copy.deepcopy(assistant.generation_config)
            for key in ASSISTANT_KEYS:
                value = getattr(self.entry, key)
                if value is not None:
                    setattr(assistant.generation_config, key, value)
        if self.entry.kind == "assistant":
            kwargs["assistant_model"] = self.draft
        torch.manual_seed(seed)
        try:
            out = self.target.generate(**kwargs)
        finally:
            if saved is not None:
                assistant.generation_config = saved
        return Generation(out[0, len(prompt_ids):].tolist())

    def forget(self) -> None:
        """Hugging Face's generate() keeps nothing across calls."""

    def modules(self) -> list[torch.nn.Module]:
        return [self.draft] if self.draft is not None else []

    def target_parts(self) -> list[torch.nn.Module]:
        return []                      # Hugging Face runs the target whole


def build_peer_rows(entries, target, draft, notes: list[str]) -> list[HFRow]:
    rows = []
    for entry in entries:
        if entry.kind == "assistant" and draft is None:
            notes.append(f"row {entry.label!r} skipped: assistant_model= needs models.draft=PATH")
            continue
        info = {k: v for k, v in OmegaConf.to_container(entry).items() if k != "label" and v is not None}
        rows.append(HFRow(entry.label, target, entry, draft if entry.kind == "assistant" else None, info))
    return rows
