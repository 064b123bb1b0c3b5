"""Peak memory of a long prompt: specdec's generate (autoregressive, eagle, eagle3) against Hugging
Face's plain `model.generate()` on the same model and prompt, each run in a process of its own.

    python scripts/measure/prefill_memory.py [--lengths 1024 4096 16384] [--src DIR] [--device cpu]

Model: the pycode target (shared/models/pycode/target, Llama, 8 layers, hidden 512) with its real
weights, in float32, loaded with max_position_embeddings raised to fit the prompt (its RoPE does not
depend on that number; past 2048 tokens its text means nothing, its memory is what a trained model's
would be). Prompt: random token ids (seeded), 8 new tokens, greedy. EAGLE drafters: random, built
by specdec.heads.eagle for this target (eagle: the last layer; eagle3: layers 2, 4, 5).

What is measured, per (runner, length), in a fresh process: the peak resident set size during the
generate call (CPU: Linux's VmHWM, reset through /proc/self/clear_refs after the model is loaded,
minus VmRSS at that moment) or the peak allocated CUDA memory (torch.cuda.max_memory_allocated, reset
after loading, minus what was allocated then). Reported in MiB, with the ratio to Hugging Face's.

--src DIR imports specdec from another checkout (e.g. a worktree of an older commit) instead of the
installed one, mapping its packages as its pyproject's package-dir does: the "before" column.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

TARGET = os.environ.get("SPECDEC_PYCODE_TARGET", "../shared/models/pycode/target")
RUNNERS = ("hf", "autoregressive", "eagle", "eagle3")
NEW_TOKENS = 8


# ---------------------------------------------------------------------- importing another checkout
def mount_checkout(src: str) -> None:
    """Import specdec (and its package-dir packages) from the checkout `src`, ahead of any install."""
    import tomllib
    with open(os.path.join(src, "pyproject.toml"), "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    mapping = {name: os.path.join(src, path) for name, path in package_dir.items()}

    class CheckoutFinder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname in mapping:
                init = os.path.join(mapping[fullname], "__init__.py")
                return importlib.util.spec_from_file_location(fullname, init,
                                                              submodule_search_locations=[mapping[fullname]])
            return None

    sys.meta_path.insert(0, CheckoutFinder)


# ---------------------------------------------------------------------- memory readings
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class Peak:
    """Peak memory from now on, above what is in use now (MiB)."""

    def __init__(self, device: str):
        import torch
        self.torch, self.cuda = torch, device.startswith("cuda")
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:     # resets VmHWM to the current RSS
                f.write("5")
            self.base = _status_kib("VmRSS") * 1024

    def read(self) -> tuple[float, float]:
        """(baseline MiB, peak above it MiB)."""
        if self.cuda:
            self.torch.cuda.synchronize()
            peak = self.torch.cuda.max_memory_allocated()
        else:
            peak = _status_kib("VmHWM") * 1024
        return self.base / 2 ** 20, (peak - self.base) / 2 ** 20


def child_env() -> dict:
    """The measuring processes' environment: glibc's malloc with a fixed mmap threshold. By default
    glibc raises the threshold each time a large block is freed, after which blocks of that size
    come from the heap and their pages stay resident after free, so the peak RSS of the same run
    varied by 10 MiB and more from process to process; with a fixed threshold every large tensor
    is its own mapping, returned when freed, and VmHWM follows the live tensors (the same for every
    runner, Hugging Face's included)."""
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    return env


# ---------------------------------------------------------------------- one measurement (child process)
def measure_one(runner: str, length: int, device: str) -> dict:
    import gc
    import torch
    import transformers as T
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32,
                                                   max_position_embeddings=max(2048, length + 64)).to(device).eval()
    prompt = torch.randint(3, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(1)).tolist()
    if runner == "hf":
        ids = torch.tensor([prompt], device=device)
        run = lambda: model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS,
                                     pad_token_id=0)
    else:
        from specdec import Speculator
        from specdec.strategies.autoregressive import Autoregressive
        if runner == "autoregressive":
            strategy = Autoregressive()
        else:
            from specdec.heads.eagle import EagleDrafter, layout_for_target
            from specdec.heads.eagle3 import Eagle3Drafter, eagle3_layout_for_target
            from specdec.strategies.eagle import Eagle
            drafter = EagleDrafter(layout_for_target(model)) if runner == "eagle" else \
                Eagle3Drafter(eagle3_layout_for_target(model, (2, 4, 5)))
            strategy = Eagle(drafter.to(device), max_nodes=8, top_k=2, depth=3)
        sd = Speculator(model, None, strategy)
        run = lambda: sd.generate(prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    gc.collect()
    peak = Peak(device)
    start = time.perf_counter()
    with torch.inference_mode():
        run()
    seconds = time.perf_counter() - start
    base, above = peak.read()
    return dict(runner=runner, length=length, base_mib=round(base, 1), peak_mib=round(above, 1),
                seconds=round(seconds, 1))


# ---------------------------------------------------------------------- the table (parent process)
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--src", default=None, help="a specdec checkout to import instead of the installed one")
    parser.add_argument("--one", nargs=2, metavar=("RUNNER", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.src:
        mount_checkout(os.path.abspath(args.src))
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.device)))
        return
    print(f"# peak memory of one generate call above the loaded model ({'RSS' if args.device == 'cpu' else 'CUDA'}"
          f", MiB); specdec from {args.src or 'the installed checkout'}; pycode target, real weights, "
          f"max_position_embeddings raised to the prompt; random prompt ids; {NEW_TOKENS} new tokens", flush=True)
    print(f"{'length':>7} {'runner':>15} {'peak MiB':>9} {'x HF':>6} {'seconds':>8}", flush=True)
    for length in args.lengths:
        hf_peak = None
        for runner in ["hf"] + [r for r in args.runners if r != "hf"]:
            command = [sys.executable, __file__, "--one", runner, str(length), "--device", args.device]
            if args.src:
                command += ["--src", args.src]
            done = subprocess.run(command, capture_output=True, text=True, env=child_env())
            if done.returncode:
                print(f"{length:>7} {runner:>15} failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            hf_peak = row["peak_mib"] if runner == "hf" else hf_peak
            ratio = f"{row['peak_mib'] / hf_peak:6.2f}" if hf_peak else "     -"
            print(f"{length:>7} {runner:>15} {row['peak_mib']:>9.1f} {ratio} {row['seconds']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
