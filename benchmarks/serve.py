"""`specdec bench serve`: our server under 1, 4 and 16 concurrent streaming clients, per strategy, and
`transformers serve --continuous-batching` on the same target when it runs here. Each server runs in a
process of its own; the clients are threads of this one, each taking the next prompt of the bench's
code set (held-out stdlib windows) until all are answered, so every level answers the same requests.

Per level: throughput (completion tokens / wall seconds of the level), time to first token and
inter-token latency (per request: (last token - first token) / (tokens - 1), vLLM's TPOT), p50 and
p95 over the requests. Beside them, each strategy's offline rate (one generate() after another in
this process) on the same prompts, for the share of its offline speed-up the server keeps at 1 client.
Writes results.json, results.md and serve.png into --output-dir."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from specdec.config import parse_overrides


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="specdec bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="key=value for every `specdec serve` (and the offline runs), e.g. "
                   "target.path=MODELS/pycode/target draft.path=MODELS/pycode/draft (default: the embedded family)")
    p.add_argument("--strategies", default="auto,autoregressive", help="comma-separated (default auto,autoregressive)")
    p.add_argument("--clients", default="1,4,16", help="concurrency levels (default 1,4,16)")
    p.add_argument("--prompts", type=int, default=16, help="requests per level, from the code set (default 16)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default 128)")
    p.add_argument("--max-tokens", type=int, default=48, help="max_tokens of each request (default 48)")
    p.add_argument("--no-transformers", action="store_true", help="skip the `transformers serve` row")
    p.add_argument("--output-dir", default="bench_out/serve", help="where results go (default bench_out/serve)")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def one_request(port: int, model: str | None, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy completion: its time to first token, per-token latency after it, tokens."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"status {response.status}: {response.read()[:300]!r}")
    first = last = None
    chunks, usage = 0, None
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"]["completion_tokens"]
        if any(choice.get("text") for choice in event.get("choices", [])):
            last = time.perf_counter()
            first = first or last
            chunks += 1
    conn.close()
    tokens = usage if usage is not None else chunks        # a server without usage in streams: a token a chunk
    return {"ttft_s": (first or time.perf_counter()) - started, "tokens": tokens, "chunks": chunks,
            "itl_s": (last - first) / (tokens - 1) if first is not None and tokens > 1 else None,
            "usage_reported": usage is not None}


def run_level(port: int, model: str | None, prompts: list[str], clients: int, max_tokens: int) -> dict:
    todo = list(enumerate(prompts))
    lock = threading.Lock()
    results: list[dict] = []
    errors: list[str] = []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                _, prompt = todo.pop(0)
            try:
                out = one_request(port, model, prompt, max_tokens)
                with lock:
                    results.append(out)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(repr(exc))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft_s"] for r in results]
    itl = [r["itl_s"] for r in results if r["itl_s"] is not None]
    return {"clients": clients, "requests": len(results), "errors": errors, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_s": _pct(ttft, 50), "ttft_p95_s": _pct(ttft, 95),
            "itl_p50_s": _pct(itl, 50), "itl_p95_s": _pct(itl, 95),
            "usage_reported": all(r["usage_reported"] for r in results)}


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def offline_rate(strategy: str, overrides: dict, prompts: list[str], max_tokens: int) -> float:
    """Tokens/s of one greedy generate() after another in this process (after one untimed warm-up)."""
    import specdec
    sd = specdec.load(strategy, **overrides)
    sd.generate(prompts[0], max_new_tokens=8, temperature=0)
    started, tokens = time.perf_counter(), 0
    for prompt in prompts:
        tokens += sd.generate(prompt, max_new_tokens=max_tokens, temperature=0).stats.new_tokens
    return tokens / (time.perf_counter() - started)


def code_prompts(overrides: dict, num: int, tokens: int) -> tuple[list[str], str]:
    """The bench's code set as text (held-out stdlib windows), and the target path it was cut for."""
    from omegaconf import OmegaConf
    from specdec.config import load_spec_config
    from specdec.models import load_tokenizer
    from .config import PromptsConfig
    from .prompts import build_prompt_sets
    cfg = load_spec_config("autoregressive", overrides)
    if cfg.target.path is None:
        from specdec.family.defaults import apply_default_paths
        apply_default_paths(cfg)
    tokenizer = load_tokenizer(cfg.target.tokenizer or cfg.target.path, "target")
    sets = build_prompt_sets(OmegaConf.structured(PromptsConfig(sets=["code"], num=num, tokens=tokens)), tokenizer,
                             10 ** 9)
    return [tokenizer.decode(p.token_ids) for p in sets["code"]], cfg.target.path


def serve_rows(args, overrides: dict, prompts: list[str], target: str, levels: list[int]) -> list[dict]:
    rows = []
    words = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in overrides.items()]
    for strategy in args.strategies.split(","):
        port = _free_port()
        process = subprocess.Popen([sys.executable, "-m", "specdec", "serve", strategy, *words, "--port", str(port),
                                    "--max-batch", str(max(levels)), "--log-level", "warning"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_healthy(port, process)
            one_request(port, None, prompts[0], 8)                          # warm-up, untimed
            for clients in levels:
                print(f"bench serve: specdec {strategy}, {clients} clients", file=sys.stderr, flush=True)
                rows.append({"server": f"specdec serve {strategy}", "strategy": strategy,
                             **run_level(port, None, prompts, clients, args.max_tokens)})
        finally:
            _stop(process)
    if args.no_transformers:
        return rows
    binary = shutil.which("transformers") or os.path.join(os.path.dirname(sys.executable), "transformers")
    port = _free_port()
    command = [binary, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1",
               "--port", str(port), target]
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        rows.append({"server": "transformers serve --continuous-batching", "skipped": f"it does not start: {exc}"})
        return rows
    try:
        _wait_healthy(port, process)
        one_request(port, target, prompts[0], 8)
        for clients in levels:
            print(f"bench serve: transformers serve, {clients} clients", file=sys.stderr, flush=True)
            rows.append({"server": "transformers serve --continuous-batching", "strategy": "plain",
                         **run_level(port, target, prompts, clients, args.max_tokens)})
    except RuntimeError as exc:
        stderr = process.stderr.read()[-600:] if process.poll() is not None else ""
        rows.append({"server": "transformers serve --continuous-batching", "skipped": f"{exc}: {stderr}"})
    finally:
        if process.poll() is None:
            _stop(process)
    return rows


def write_results(out_dir: str, result: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    ms = lambda v: "-" if v is None else f"{1000 * v:.0f}"    # noqa: E731
    lines = ["| server | clients | requests | tokens/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['server']} | - | - | skipped: {row['skipped']} | | | | |")
            continue
        lines.append(f"| {row['server']} | {row['clients']} | {row['requests']} | {row['tokens_per_s']:.1f} | "
                     f"{ms(row['ttft_p50_s'])} | {ms(row['ttft_p95_s'])} | {ms(row['itl_p50_s'])} | "
                     f"{ms(row['itl_p95_s'])} |")
    lines += ["", "| strategy | offline tokens/s |", "| --- | --- |"]
    lines += [f"| {name} | {rate:.1f} |" for name, rate in result["offline_tokens_per_s"].items()]
    with open(os.path.join(out_dir, "results.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    from .plots import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    servers = sorted({row["server"] for row in result["rows"] if "skipped" not in row})
    for server in servers:
        rows = [row for row in result["rows"] if row.get("server") == server and "skipped" not in row]
        x = [row["clients"] for row in rows]
        axes[0].plot(x, [row["tokens_per_s"] for row in rows], marker="o", label=server)
        axes[1].plot(x, [1000 * row["ttft_p50_s"] for row in rows], marker="o", label=server)
        axes[2].plot(x, [1000 * (row["itl_p50_s"] or 0) for row in rows], marker="o", label=server)
    for ax, title in zip(axes, ("throughput (tokens/s)", "TTFT p50 (ms)", "ITL p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "serve.png"), dpi=120)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    overrides = parse_overrides(args.overrides)
    levels = [int(c) for c in args.clients.split(",")]
    prompts, target = code_prompts(overrides, args.prompts, args.prompt_tokens)
    overrides.setdefault("target.path", target)
    offline = {}
    for strategy in args.strategies.split(","):
        print(f"bench serve: offline {strategy}", file=sys.stderr, flush=True)
        offline[strategy] = offline_rate(strategy, overrides, prompts, args.max_tokens)
    rows = serve_rows(args, overrides, prompts, target, levels)
    from .machine import machine_info
    import torch
    result = {"command": "specdec bench serve " + " ".join(argv),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine_info(torch.device("cpu"), torch.float32), "prompts": args.prompts,
              "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
              "offline_tokens_per_s": offline, "rows": rows}
    write_results(args.output_dir, result)
    print(open(os.path.join(args.output_dir, "results.md")).read())
    return 0
