"""The family's target: a small Llama causal LM, trained from scratch on a token stream: AdamW,
warmup then cosine decay, random windows drawn by a seeded generator (deterministic from the seed),
a tqdm bar showing the loss, and the held-out loss measured at the end. (The draft is distilled
into it by `specdec train-draft`'s code: family/heads.py.)"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.heads.loop import lr_at  # noqa: F401 - the one schedule of every trainer; this module's name too


def tokenize_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Documents joined into one stream, each followed by <|endoftext|>.  # [num_tokens]"""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def new_llama(lm_cfg, vocab_size: int, special_id: int, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=lm_cfg.hidden_size,
                         intermediate_size=lm_cfg.intermediate_size, num_hidden_layers=lm_cfg.num_layers,
                         num_attention_heads=lm_cfg.num_heads, num_key_value_heads=lm_cfg.num_heads,
                         max_position_embeddings=lm_cfg.max_position_embeddings, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, bos_token_id=special_id, eos_token_id=special_id,
                         pad_token_id=special_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def random_windows(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """batch_size windows of seq_len + 1 tokens at random offsets.  # [batch, seq_len + 1]"""
    if len(stream) < seq_len + 2:
        raise ValueError(f"the token stream has {len(stream)} tokens, fewer than one window of {seq_len + 1}: "
                         f"raise corpus.train_chars or lower train.seq_len")
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()])


def window_loss(model, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token) over the windows  # windows: [batch, seq_len + 1]"""
    logits = model(input_ids=windows[:, :-1]).logits                       # [batch, seq_len, vocab]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


def train_lm(model, train_stream: torch.Tensor, train_cfg, seed: int, desc: str) -> list[float]:
    """Train in place on the text; returns the loss of every step."""
    generator = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train_cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=train_cfg.lr, betas=(0.9, 0.95))
    model.train()
    losses: list[float] = []
    bar = tqdm(range(train_cfg.steps), desc=desc, unit="step", dynamic_ncols=True)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, train_cfg)
        windows = random_windows(train_stream, train_cfg.batch_size, train_cfg.seq_len, generator)
        loss = window_loss(model, windows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{optimizer.param_groups[0]['lr']:.1e}")
    bar.close()
    model.eval()
    return losses


@torch.no_grad()
def heldout_loss(model, heldout_stream: torch.Tensor, train_cfg, seed: int) -> float | None:
    """Mean loss over eval_windows seeded held-out windows (None when the held-out text is too short)."""
    if train_cfg.eval_windows < 1 or len(heldout_stream) < train_cfg.seq_len + 2:
        return None
    generator = torch.Generator().manual_seed(seed + 1)
    windows = random_windows(heldout_stream, train_cfg.eval_windows, train_cfg.seq_len, generator)
    return float(window_loss(model.eval(), windows))
