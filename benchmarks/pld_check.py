"""Prompt lookup on the pycode target: ours (a trie of matches) vs plain decoding through the same
loop vs Hugging Face's `prompt_lookup_num_tokens` (a chain from the first match), greedy.

Prompts of --prompt-tokens tokens are cut at seeded random places from held-out standard-library
files (split.json); every method generates --new-tokens tokens (EOS ignored) on the same prompts,
in the same process, interleaved prompt by prompt. Each output is checked against HF's plain
greedy generate(). Also measures the lookup's own per-step cost on a long context.

    python -m specdec.benchmarks.pld_check --models MODELS/pycode       # or: python benchmarks/pld_check.py
    python benchmarks/pld_check.py --models MODELS/pycode --variant small:num_tokens=6,max_nodes=12

--models is the folder of the pycode models: target/ (with its tokenizer) and split.json, whose
"heldout" list names standard-library files relative to this Python's standard library.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.types import DecodeState, StepResult
from specdec.sampling import SamplingParams, TorchRandom

def heldout_prompts(tokenizer, models: str, count: int, length: int, seed: int) -> list[tuple[str, list[int]]]:
    """`count` prompts of `length` tokens cut at seeded random places from distinct held-out files."""
    stdlib = os.path.dirname(os.__file__)
    with open(os.path.join(models, "split.json")) as fh:
        names = sorted(json.load(fh)["heldout"])
    rng = random.Random(seed)
    rng.shuffle(names)
    prompts = []
    for name in names:
        with open(os.path.join(stdlib, name), encoding="utf-8") as fh:
            ids = tokenizer(fh.read())["input_ids"]
        if len(ids) < 2 * length:
            continue
        start = rng.randrange(0, len(ids) - length)
        prompts.append((name, ids[start: start + length]))
        if len(prompts) == count:
            break
    return prompts


class ForwardCounter:
    """Counts forward calls of a module (HF generate's target forwards)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.calls += 1


def hf_generate(model, prompt_ids, new_tokens, **kwargs) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=new_tokens, **kwargs)
    return out[0, len(prompt_ids):].tolist()


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, settings = text.partition(":")
    kwargs = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = int(value)
    return name, kwargs


def step_cost(tokenizer, models: str, context_len: int = 2000, steps: int = 300, seed: int = 0) -> dict:
    """Mean time of one propose + observe at a ~context_len-token context (and of the reset)."""
    stdlib = os.path.dirname(os.__file__)
    with open(os.path.join(models, "split.json")) as fh:
        names = sorted(json.load(fh)["heldout"])
    ids: list[int] = []
    for name in names:
        with open(os.path.join(stdlib, name), encoding="utf-8") as fh:
            ids += tokenizer(fh.read())["input_ids"]
        if len(ids) > context_len + 4 * steps:
            break
    rng = random.Random(seed)
    strategy = PromptLookup()
    state = DecodeState(token_ids=ids[:context_len], prompt_len=context_len, sampling=SamplingParams(),
                        rng=TorchRandom(torch.Generator()), max_depth=1 << 30, eos_token_ids=frozenset())
    t0 = time.perf_counter()
    strategy.reset(state)
    reset_s = time.perf_counter() - t0
    nodes = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        tree = strategy.propose(state)
        nodes += tree.num_nodes
        before = len(state.token_ids)
        state.token_ids.extend(ids[before: before + rng.randint(1, 3)])
        strategy.observe(state, StepResult(tree, (), 0, before))
    per_step = (time.perf_counter() - t0) / steps
    return {"context_tokens": context_len, "reset_ms": 1e3 * reset_s, "step_us": 1e6 * per_step,
            "mean_nodes": nodes / steps, "final_context": len(state.token_ids)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="the pycode models' folder (target/, split.json)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=384)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", action="append", default=[],
                        help="extra prompt_lookup row, name:key=value,... (e.g. small:num_tokens=6,max_nodes=12)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.models, "target"))
    print("lookup cost per step:", json.dumps({k: round(v, 2) for k, v in step_cost(tokenizer, args.models).items()}))

    model = AutoModelForCausalLM.from_pretrained(os.path.join(args.models, "target"), dtype=torch.float32).eval()
    counter = ForwardCounter(model)
    eos = model.generation_config.eos_token_id
    ours = {"autoregressive": specdec.Speculator(model, tokenizer, Autoregressive()),
            "prompt_lookup": specdec.Speculator(model, tokenizer, PromptLookup())}
    for variant in args.variant:
        name, kwargs = parse_variant(variant)
        ours[f"prompt_lookup[{name}]"] = specdec.Speculator(model, tokenizer, PromptLookup(**kwargs))

    prompts = heldout_prompts(tokenizer, args.models, args.prompts, args.prompt_tokens, args.seed)
    n = args.new_tokens
    rows: dict[str, dict] = {}

    def record(row, seconds, forwards, same):
        r = rows.setdefault(row, {"seconds": 0.0, "tokens": 0, "forwards": 0, "same": 0})
        r["seconds"] += seconds
        r["tokens"] += n
        r["forwards"] += forwards
        r["same"] += int(same)

    # warm-up (allocator, kernels), not recorded
    warm = prompts[0][1][:64]
    hf_generate(model, warm, 8)
    for speculator in ours.values():
        speculator.generate(warm, max_new_tokens=8, ignore_eos=True)

    for name, prompt in prompts:
        # HF plain greedy with EOS ignored (not suppressed): the reference every row must equal
        model.generation_config.eos_token_id = None
        counter.calls = 0
        t0 = time.perf_counter()
        reference = hf_generate(model, prompt, n)
        record("HF generate() plain", time.perf_counter() - t0, counter.calls, True)
        model.generation_config.eos_token_id = eos
        for row, speculator in ours.items():
            t0 = time.perf_counter()
            out = speculator.generate(prompt, max_new_tokens=n, ignore_eos=True)
            record(f"specdec {row}", time.perf_counter() - t0, out.stats.target_forwards + 1,
                   out.token_ids == reference)
            rows[f"specdec {row}"].setdefault("tau", []).append(out.stats.tokens_per_forward)
        counter.calls = 0
        t0 = time.perf_counter()
        hf_pld = hf_generate(model, prompt, n, prompt_lookup_num_tokens=10, min_new_tokens=n)
        record("HF prompt_lookup_num_tokens=10", time.perf_counter() - t0, counter.calls, hf_pld == reference)
        print(f"{name}: done", flush=True)

    base = rows["specdec autoregressive"]["tokens"] / rows["specdec autoregressive"]["seconds"]
    print(f"\n{len(prompts)} prompts x {args.prompt_tokens} tokens, {n} new tokens, greedy, EOS ignored, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'row':42s} {'tok/s':>7s} {'x AR':>6s} {'tok/fwd':>8s} {'same':>5s}")
    for row, r in rows.items():
        tps = r["tokens"] / r["seconds"]
        # tok/fwd: new tokens per target forward, the prefill forward counted (HF's first forward
        # yields a token; ours prefills prompt[:-1] and then every verify forward yields tokens)
        print(f"{row:42s} {tps:7.1f} {tps / base:6.2f} {r['tokens'] / r['forwards']:8.2f} "
              f"{r['same']}/{len(prompts)}")
    for row, r in rows.items():
        if "tau" in r:
            print(f"{row}: tokens per verify forward (prefill not counted) per prompt: "
                  + ", ".join(f"{t:.2f}" for t in r["tau"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
