"""specdec's self-speculation against Hugging Face's own, run by the installed transformers' code:
`early_exit` beside `generate(assistant_early_exit=E)`, step by step, and `mtp` beside
`generate(use_mtp=True)`, position by position.

    python scripts/interop/hf_self_spec.py                      # tiny random llamas, E = 1 .. L - 1
    python scripts/interop/hf_self_spec.py --target DIR --exit 2 4 6 --new 64
    python scripts/interop/hf_self_spec.py --mtp                # tiny random GLM-4.5 and DeepSeek-V3 with MTP modules

For each exit layer it runs both on the same prompts, greedy, chains of `--tokens` drafted tokens, and
prints one row: whether the outputs are equal (and equal to plain greedy), whether every step drafted
the same tokens, and each side's target forwards and tokens per forward. Hugging Face's drafts are read
from its EarlyExitCandidateGenerator.get_candidates as generate() calls it.

Hugging Face is run with a constant schedule of `--tokens` drafts (num_assistant_tokens_schedule
"constant", assistant_confidence_threshold 0: no early stop of its chain), and with no EOS and no pad
token in the generation config: its assistant infers an attention mask from `input_ids != pad_token_id`,
so a generated token equal to the pad id (0 in the tests' tiny models) would be masked out of its own
drafting (the main model is given its mask and is not), and with an EOS its drafts stop there.
tests/test_early_exit_hf.py runs the same comparison in CI.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import re
import sys
from dataclasses import dataclass

import torch


@dataclass
class Run:
    tokens: list[int]                  # the new tokens
    drafts: list[list[int]]            # each step's drafted tokens
    forwards: int                      # target forwards after the prefill (verify steps)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / self.forwards if self.forwards else 0.0


@contextlib.contextmanager
def hf_settings(model, num_tokens: int):
    """The model's generation_config set for a constant chain of `num_tokens` drafts, with no EOS and no
    pad token (see the module's docstring); restored afterwards."""
    saved = model.generation_config
    config = copy.deepcopy(saved)
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = num_tokens, "constant"
    config.assistant_confidence_threshold = 0.0
    config.eos_token_id = config.pad_token_id = None
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


@contextlib.contextmanager
def recorded(generator_class, drafts: list[list[int]]):
    """Record every step's drafted tokens of Hugging Face's `generator_class` into `drafts`."""
    real = generator_class.get_candidates

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, logits = real(self, input_ids, *args, **kwargs)
        drafts.append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    generator_class.get_candidates = get_candidates
    try:
        yield
    finally:
        generator_class.get_candidates = real


def hf_early_exit(model, prompt: list[int], exit_layer: int, num_tokens: int, new_tokens: int) -> Run:
    """Hugging Face's generate(assistant_early_exit=exit_layer), greedy: its output and drafts."""
    from transformers.generation.candidate_generator import EarlyExitCandidateGenerator
    drafts: list[list[int]] = []
    ids = torch.tensor([prompt], device=model.device)
    with hf_settings(model, num_tokens), recorded(EarlyExitCandidateGenerator, drafts), torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, assistant_early_exit=exit_layer)
    return Run(out[0, len(prompt):].tolist(), drafts, len(drafts))     # one target forward per call


def specdec_early_exit(model, prompt: list[int], exit_layer: int, num_tokens: int, new_tokens: int) -> Run:
    """specdec's early_exit chain, greedy: its output, drafts and verify forwards."""
    from specdec import Speculator
    from specdec.strategies.early_exit import EarlyExit
    drafts: list[list[int]] = []

    class Recorded(EarlyExit):
        def propose(self, state):
            tree = super().propose(state)
            drafts.append(tree.tokens.tolist())
            return tree

    out = Speculator(model, None, Recorded(exit_layer, num_tokens=num_tokens)).generate(
        prompt, max_new_tokens=new_tokens, ignore_eos=True)
    return Run(out.token_ids, drafts, out.stats.target_forwards)


def plain_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    with hf_settings(model, 1), torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


@dataclass
class Comparison:
    exit_layer: int
    same_output: bool                  # specdec's tokens == Hugging Face's == plain greedy, every prompt
    same_drafts: bool                  # every step drafted the same tokens, every prompt
    hf_forwards: int
    specdec_forwards: int
    new_tokens: int

    def row(self) -> str:
        return (f"| {self.exit_layer} | {'yes' if self.same_output else 'NO'} | {'yes' if self.same_drafts else 'NO'} | "
                f"{self.hf_forwards} | {self.specdec_forwards} | {self.new_tokens / self.hf_forwards:.3f} | "
                f"{self.new_tokens / self.specdec_forwards:.3f} |")


def compare_early_exit(model, prompts: list[list[int]], exit_layer: int, num_tokens: int = 4,
                       new_tokens: int = 24) -> Comparison:
    same_output = same_drafts = True
    hf_forwards = ours_forwards = total = 0
    for prompt in prompts:
        plain = plain_greedy(model, prompt, new_tokens)
        hf = hf_early_exit(model, prompt, exit_layer, num_tokens, new_tokens)
        ours = specdec_early_exit(model, prompt, exit_layer, num_tokens, new_tokens)
        same_output &= hf.tokens == ours.tokens == plain
        same_drafts &= hf.drafts == ours.drafts
        hf_forwards += hf.forwards
        ours_forwards += ours.forwards
        total += len(ours.tokens)
    return Comparison(exit_layer, same_output, same_drafts, hf_forwards, ours_forwards, total)


def tiny_llama(layers: int = 4, seed: int = 0):
    """A tiny random llama (hidden 32, a 96-token vocabulary), fp32, peaked: the tests' kind."""
    import transformers as T
    config = T.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    return model


# ---------------------------------------------------------------------- MTP
def tiny_glm_config(layers: int = 46, modules: int = 1, vocab_size: int = 96):
    """A tiny GLM-4.5 (Glm4Moe) config with `modules` MTP modules. 46 layers: the MTP layer's index (46, GLM-4.5-Air's
    layout) is one that the installed transformers' MtpModel.from_pretrained looks for (it reads the checkpoint
    keys the model class lists as MTP patterns, model.layers.46.* and model.layers.92.*)."""
    import transformers as T
    return T.Glm4MoeConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                           num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=layers,
                           max_position_embeddings=512, num_nextn_predict_layers=modules, partial_rotary_factor=0.5,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)


def tiny_deepseek_config(layers: int = 61, modules: int = 1, vocab_size: int = 96):
    """A tiny DeepSeek-V3 config (multi-head latent attention, MoE) with `modules` MTP modules. 61 layers: the MTP
    layer's index (61, DeepSeek-V3/R1's layout) is the one the installed transformers' MtpModel.from_pretrained
    looks for (model.layers.61.*). The decoder layers are dense (first_k_dense_replace = layers) to keep it fast;
    the MTP block is a MoE layer, as MtpModel builds it."""
    import transformers as T
    return T.DeepseekV3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                              n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                              first_k_dense_replace=layers, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=4,
                              qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=512,
                              num_nextn_predict_layers=modules, bos_token_id=1, eos_token_id=2, pad_token_id=0)


# {architecture: its tiny config at the layer count whose MTP layer index the installed transformers reads}
TINY_MTP_CONFIGS = {"glm-4.5": tiny_glm_config, "deepseek-v3": tiny_deepseek_config}


@torch.no_grad()
def save_with_mtp(model, folder: str, seed: int = 1) -> dict:
    """Save `model` to `folder` with random MTP modules (as many as its config announces) in the checkpoint
    layout DeepSeek-V3 and GLM-4.5 ship: model.layers.{L + i}.{enorm, hnorm, eh_proj, shared_head.norm,
    shared_head.head, embed_tokens} and the decoder block's own tensors, written as Hugging Face writes that
    block. Returns the MTP tensors added {name: tensor}."""
    import os
    import tempfile
    from safetensors.torch import load_file, save_file
    import transformers as T
    from transformers.modeling_layers import MtpModel
    model.save_pretrained(folder)
    torch.manual_seed(seed)
    mtp = MtpModel(model, model.config.num_mtp_layers)
    for parameter in mtp.layers.parameters():   # MtpModel leaves its fused experts' weights uninitialised memory
        if parameter.dim() > 1:
            torch.nn.init.normal_(parameter, std=model.config.initializer_range)
    layers = model.config.num_hidden_layers
    added = {}
    for i, module in enumerate(mtp.layers):
        # the block in checkpoint naming: a one-layer model of the target's class holding it, saved by Hugging Face
        one = copy.deepcopy(model.config)
        one.num_hidden_layers, one.first_k_dense_replace = 1, 0
        carrier = T.AutoModelForCausalLM.from_config(one)
        carrier.model.layers[0].load_state_dict(module.mtp_block.state_dict(), strict=True)
        with tempfile.TemporaryDirectory() as tmp:
            carrier.save_pretrained(tmp)
            for name, tensor in load_file(os.path.join(tmp, "model.safetensors")).items():
                if name.startswith("model.layers.0."):
                    added[name.replace("model.layers.0.", f"model.layers.{layers + i}.")] = tensor
        for name, tensor in (("enorm.weight", module.enorm.weight), ("hnorm.weight", module.hnorm.weight),
                             ("eh_proj.weight", module.eh_proj.weight), ("shared_head.norm.weight", module.post_norm.weight),
                             ("shared_head.head.weight", model.lm_head.weight),
                             ("embed_tokens.weight", model.get_input_embeddings().weight)):
            added[f"model.layers.{layers + i}.{name}"] = tensor.detach().clone()
    file = os.path.join(folder, "model.safetensors")
    tensors = load_file(file)
    tensors.update(added)
    save_file(tensors, file, metadata={"format": "pt"})
    return added


def tiny_with_mtp(folder: str, architecture: str = "glm-4.5", **config):
    """A tiny random checkpoint of `architecture` (TINY_MTP_CONFIGS; `config`: its config function's arguments)
    saved in `folder` with its MTP modules, loaded back from there (fp32, eval)."""
    import transformers as T
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(TINY_MTP_CONFIGS[architecture](**config)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    save_with_mtp(model, folder)
    return T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def announce_every_module(model) -> None:
    """Hugging Face's MtpModel.from_pretrained finds a checkpoint's MTP tensors by the patterns its model class lists
    (GLM-4.5: layers 46 and 92; DeepSeek-V3: 61), so of a checkpoint with several modules it misses all but the
    first and use_mtp stops with its own "weights are missing" error. Give the model instance the patterns of every
    layer its config announces; Hugging Face's loading and drafting code run unchanged."""
    layers = model.config.num_hidden_layers
    patterns = [rf"model\.layers\.{layers + i}\." for i in range(model.config.num_mtp_layers)]
    if not all(any(re.search(p, f"model.layers.{layers + i}.enorm.weight") for p in model._keys_to_ignore_on_load_unexpected)
               for i in range(model.config.num_mtp_layers)):
        model._keys_to_ignore_on_load_unexpected = patterns


def hf_mtp(model, prompt: list[int], new_tokens: int) -> tuple[list[int], dict[int, list[int]]]:
    """Hugging Face's generate(use_mtp=True), greedy: (new tokens, {position: the chain drafted from there on}).
    It drafts one token per MTP module at every step."""
    from transformers.generation.candidate_generator import MTPCandidateGenerator
    drafted: dict[int, list[int]] = {}
    real = MTPCandidateGenerator.get_candidates

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, logits = real(self, input_ids, *args, **kwargs)
        if ids.shape[1] > input_ids.shape[1]:
            drafted[input_ids.shape[1]] = ids[0, input_ids.shape[1]:].tolist()
        return ids, logits

    ids = torch.tensor([prompt], device=model.device)
    announce_every_module(model)
    MTPCandidateGenerator.get_candidates = get_candidates
    try:
        with hf_settings(model, 1), torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, use_mtp=True)
    finally:
        MTPCandidateGenerator.get_candidates = real
    return out[0, len(prompt):].tolist(), drafted


def specdec_mtp(model, prompt: list[int], new_tokens: int, depth: int = 1) -> tuple[list[int], dict[int, list[int]]]:
    """specdec's mtp chain of `depth`, greedy: (new tokens, {position: the chain drafted from there on})."""
    from specdec import Speculator
    from specdec.strategies.mtp import Mtp
    drafted: dict[int, list[int]] = {}

    class Recorded(Mtp):
        def propose(self, state):
            tree = super().propose(state)
            if len(tree.tokens):
                drafted[len(state.token_ids)] = tree.tokens.tolist()
            return tree

    strategy = Recorded.for_target(model, depth=depth, max_nodes=depth)
    out = Speculator(model, None, strategy).generate(prompt, max_new_tokens=new_tokens, ignore_eos=True)
    return out.token_ids, drafted


@dataclass
class MtpComparison:
    same_output: bool                  # specdec's tokens == Hugging Face's == plain greedy
    steps: int                         # positions both drafted from (HF skips the first step, and drafts at the last
    #                                    one, where one token is left and specdec drafts none)
    same_steps: int                    # of them, those where both drafted the same chain, as deep as the shorter
    full_depth: int                    # of them, those where both drafted as deep as the modules
    kept: int                          # Hugging Face's steps that kept at least one drafted token


def compare_mtp(model, prompt: list[int], new_tokens: int) -> MtpComparison:
    """Hugging Face's use_mtp beside specdec's mtp chain as deep as the checkpoint's modules (HF drafts one token
    per module), greedy. Near the end specdec drafts no deeper than the tokens left."""
    modules = model.config.num_mtp_layers
    plain = plain_greedy(model, prompt, new_tokens)
    hf_tokens, hf_drafts = hf_mtp(model, prompt, new_tokens)
    ours, our_drafts = specdec_mtp(model, prompt, new_tokens, depth=modules)
    both = sorted(set(hf_drafts) & set(our_drafts))
    same = sum(hf_drafts[p][:len(our_drafts[p])] == our_drafts[p][:len(hf_drafts[p])] for p in both)
    full = sum(len(hf_drafts[p]) == len(our_drafts[p]) == modules for p in both)
    starts = sorted(hf_drafts)
    kept = sum(b - a > 1 for a, b in zip(starts, starts[1:]))      # the next step starts past the bonus token
    return MtpComparison(hf_tokens == ours == plain, len(both), same, full, kept)


SMALL_VOCAB = 6              # a vocabulary where random MTP modules' drafts are often kept, and prompts in it
SMALL_PROMPTS = [[5, 1, 3, 4, 2, 0, 1], [3, 4, 3, 4, 3], [0, 1, 2, 3, 4, 5]]
TINY_PROMPTS = [[5, 17, 33, 9, 41, 60, 70], [8, 9, 10, 11, 12, 13, 8, 9], [60, 70, 60, 70, 60]]
CODE_PROMPTS = ["def parse(text):\n    ", "class Foo:\n    def __init__(self", "import os\n\n\ndef main(argv):\n"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="a Hugging Face causal LM folder (default: tiny random llamas)")
    parser.add_argument("--exit", type=int, nargs="*", help="exit layers (default: 1 .. L - 1)")
    parser.add_argument("--tokens", type=int, default=4, help="drafted tokens per step")
    parser.add_argument("--new", type=int, default=24, help="new tokens per prompt")
    parser.add_argument("--modules", type=int, nargs="*", default=[1, 2, 3], help="--mtp: MTP modules per checkpoint")
    parser.add_argument("--mtp", action="store_true", help="compare mtp with use_mtp=True on tiny GLM-4.5 and DeepSeek-V3 checkpoints")
    args = parser.parse_args(argv)
    if args.mtp:
        return compare_mtp_main(args.new, args.modules)
    if args.target:
        import transformers as T
        model = T.AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        tokenizer = T.AutoTokenizer.from_pretrained(args.target)
        prompts = [tokenizer(p)["input_ids"] for p in CODE_PROMPTS]
    else:
        model, prompts = tiny_llama(), TINY_PROMPTS
    layers = model.config.num_hidden_layers
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {args.target or 'tiny random llama'}"
          f" ({layers} layers), {len(prompts)} prompts x {args.new} new tokens, chains of {args.tokens}, greedy fp32\n")
    print("| exit layer | same output | same drafts every step | HF forwards | specdec forwards | HF tok/fwd | specdec tok/fwd |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for exit_layer in args.exit or range(1, layers):
        result = compare_early_exit(model, prompts, exit_layer, args.tokens, args.new)
        ok &= result.same_output and result.same_drafts
        print(result.row())
    return 0 if ok else 1


def compare_mtp_main(new_tokens: int, modules: list[int]) -> int:
    import tempfile
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; tiny random checkpoints saved with "
          f"their MTP modules, {len(TINY_PROMPTS)} prompts x {new_tokens} new tokens, greedy fp32, specdec's chain "
          f"as deep as the modules. Random modules over 96 tokens seldom guess right; over {SMALL_VOCAB} tokens they "
          f"sometimes do, and steps keep drafts\n")
    print("| checkpoint | vocabulary | MTP modules | prompt | same output | steps both drafted | same chain drafted "
          "there | of them, as deep as the modules | HF steps that kept a draft |")
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for architecture in TINY_MTP_CONFIGS:
        for vocab in (96, SMALL_VOCAB):
            for count in modules:
                with tempfile.TemporaryDirectory() as folder:
                    model = tiny_with_mtp(folder, architecture, modules=count, vocab_size=vocab)
                    for i, prompt in enumerate(TINY_PROMPTS if vocab > SMALL_VOCAB else SMALL_PROMPTS):
                        result = compare_mtp(model, prompt, new_tokens)
                        ok &= result.same_output and result.same_steps == result.steps
                        print(f"| {architecture} ({model.config.num_hidden_layers} layers) | {vocab} | {count} | {i} | "
                              f"{'yes' if result.same_output else 'NO'} | {result.steps} | {result.same_steps} | "
                              f"{result.full_depth} | {result.kept} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
