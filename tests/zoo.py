"""One builder of every strategy on a tiny target, for the tests that run them all (device syncs,
the device check): the same settings wherever the target lives."""
from __future__ import annotations

import torch


def random_heads(model):
    """Plain Medusa heads (3 heads of 1 layer) for `model`, random, their weights pushed further from
    zero than PyTorch's init so that their guesses vary."""
    from specdec.heads import HeadsLayout, MedusaHeads
    from specdec.models import output_vocab_size
    heads = MedusaHeads(HeadsLayout(3, 1, model.config.hidden_size, output_vocab_size(model)))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return heads


# every strategy strategies() builds, in its order: the names the tests that run them all parametrize over
NAMES = ("autoregressive", "prompt_lookup", "suffix", "token_recycling", "lookahead", "draft chain", "draft tree",
         "medusa", "medusa conditioned", "eagle", "early_exit chain", "early_exit tree", "layer_skip chain",
         "layer_skip auto", "auto")


def strategies(target):
    from conftest import noisy_copy
    from eagle_helpers import random_drafter
    from specdec.costmodel import CostProfile
    from specdec.heads import HeadsLayout, MedusaHeads
    from specdec.heads.io import output_vocab
    from specdec.strategies.auto import Auto
    from specdec.strategies.autoregressive import Autoregressive
    from specdec.strategies.draft_model import DraftModel
    from specdec.strategies.eagle import Eagle
    from specdec.strategies.early_exit import EarlyExit
    from specdec.strategies.layer_skip import LayerSkip
    from specdec.strategies.medusa import Medusa
    from specdec.strategies.prompt_lookup import PromptLookup
    from specdec.strategies.suffix import Suffix
    from specdec.strategies.token_recycling import TokenRecycling
    from specdec.strategies.lookahead import Lookahead

    def heads(conditioned):
        torch.manual_seed(0)
        return MedusaHeads(HeadsLayout(3, 1, target.config.hidden_size, output_vocab(target),
                                       token_conditioned=conditioned)).to(target.device)

    draft = noisy_copy(target, 0.3)
    return {
        "autoregressive": lambda: Autoregressive(),
        "prompt_lookup": lambda: PromptLookup(),
        "suffix": lambda: Suffix(),
        "token_recycling": lambda: TokenRecycling(costs=CostProfile((0, 64), (1.0, 1.5), 0)),
        "lookahead": lambda: Lookahead(window=3, ngram=3, guesses=2),
        "draft chain": lambda: DraftModel(draft, num_tokens=4),
        "draft tree": lambda: DraftModel(draft, branching=[3, 2, 1, 1]),
        "medusa": lambda: Medusa(heads(False), max_nodes=8, top_k=4),
        "medusa conditioned": lambda: Medusa(heads(True), max_nodes=8, top_k=4),
        "eagle": lambda: Eagle(random_drafter(target), max_nodes=16, top_k=4, depth=6),
        "early_exit chain": lambda: EarlyExit(1, num_tokens=4),
        "early_exit tree": lambda: EarlyExit(1, branching=[3, 2, 1, 1]),
        "layer_skip chain": lambda: LayerSkip(attention=[0], num_tokens=4),
        "layer_skip auto": lambda: LayerSkip(auto=True, every=4, branching=[3, 2, 1, 1]),
        "auto": lambda: Auto(PromptLookup(), DraftModel(draft, num_tokens=4), costs=CostProfile((0, 64), (1.0, 1.5), 0),
                             adapt_costs=False, draft_cost_s=0.0),
    }


def tiny_training_target(root):
    """A tiny saved target (llama, char tokenizer) and a corpus of 3 small .py files under `root`, for
    the trainers' tests: (target folder, corpus folder)."""
    from conftest import char_tokenizer, tiny_model
    tiny_model("llama", seed=0, sharpen=3.0).save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} - {i}\n" for j in range(30)))
    return str(root / "target"), str(corpus)


def stop_at(step: int, error: BaseException):
    """A trainer's on_step that raises `error` once step `step` is finished: a Ctrl-C there
    (KeyboardInterrupt: the loop saves that step's checkpoint) or a crash (anything else: the last
    periodic checkpoint is what is left)."""
    def on_step(done: int, metrics: dict) -> None:
        if done == step:
            raise error
    return on_step


def count_windows(monkeypatch, interrupt_at: int | None = None) -> list[int]:
    """Count the training batches drawn; on call `interrupt_at`, draw it (the window RNG moves on)
    and then raise KeyboardInterrupt, as a Ctrl-C in the middle of that step's forward would."""
    from specdec.family import lm as family_lm
    from specdec.heads import loop as trainer          # every trainer draws its windows in the one loop: with
    calls = []                                         # sample_windows, the family's target with builder_windows

    def counted(draw):
        def windows(*args, **kwargs):
            calls.append(1)
            batch = draw(*args, **kwargs)
            if len(calls) == interrupt_at:
                raise KeyboardInterrupt
            return batch
        return windows
    monkeypatch.setattr(trainer, "sample_windows", counted(trainer.sample_windows))
    monkeypatch.setattr(family_lm, "builder_windows", counted(family_lm.builder_windows))
    return calls
