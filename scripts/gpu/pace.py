"""Where a slow forward's time goes on the GPU machine: host or device.

Both H100 leases and the H200 lease saw a 29M-parameter model take 40-80 ms a token on a GPU whose
clocks sat at idle. This times one cached decode forward three ways (wall clock with a sync, CUDA
events, a forward with no sync), Hugging Face's generate(), and profiles one generate() by Python
function and by torch operator, so the next reading can say which side is slow.

    python3 scripts/gpu/pace.py TARGET_DIR [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    print("threads", torch.get_num_threads(), "cpus", os.cpu_count(),
          {k: v for k, v in os.environ.items() if "THREAD" in k or "CUDA" in k})
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=getattr(torch, args.dtype)).cuda().eval()
    ids = torch.randint(10, 4000, (1, 256), device="cuda")
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for label, sync in (("sync each", True), ("no sync", False)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(100):
                out = model(token, past_key_values=cache, use_cache=True)
                if sync:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            print(f"decode forward, {label}: {(time.perf_counter() - start) * 10:.2f} ms")
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(100):
            model(token, past_key_values=cache, use_cache=True)
        end.record()
        torch.cuda.synchronize()
        print(f"decode forward, CUDA events: {begin.elapsed_time(end) / 100:.2f} ms")
        mask = torch.ones_like(ids)
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=None)
            torch.cuda.synchronize()
            print(f"HF generate 64 tokens: {(time.perf_counter() - start) * 1000 / 64:.2f} ms a token")
        profiler = cProfile.Profile()
        profiler.enable()
        model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=None)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
        print(text.getvalue()[-4000:])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                model(token, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
