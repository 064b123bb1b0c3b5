"""Our `suffix` proposer against Arctic Inference's SuffixDecodingCache, offline, on the same traffic.

    .venv/bin/python scripts/interop/suffix_vs_arctic.py [--prompts 4] [--samples 4] [--new 64]

1. Builds the side environment once, under build/ (git-ignored): a venv with nanobind 2.9.2, cmake,
   ninja and numpy, the arctic-inference 0.3.0 sdist from PyPI, and its suffix_decoding extension
   compiled with cmake alone (the rest of the package — vLLM patches, CUDA ops, gRPC — is not needed
   and not built; setup.py would import torch and compile protobufs for them).
2. Records traffic once with the pycode target (--models: its folder, by default where the shipped
   configs read it): held-out code prompts, several samples each at T = 0.8 (pass@k style), then each
   prompt with one line edited, greedy. Saved to build/suffix_replay.json.
3. Replays the requests in order through both proposers, like Arctic's simulator: each request
   starts with its prompt, and at every step the proposer drafts after the context, the draft's
   longest prefix (path) or root-to-node path (tree) that equals the recorded response is accepted,
   plus one token (the target's), and the context moves on; a finished response joins the
   cross-request cache. Same cached outputs, same budgets (max_spec_tokens = node budget, depth,
   factor, min_token_prob). Prints accepted tokens per step for Arctic (path), ours (path), ours (tree).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SIDE_VENV = BUILD / "arctic-venv"
SDIST_DIR = BUILD / "arctic"
SOURCE = SDIST_DIR / "arctic_inference-0.3.0"
SIMPLE_INDEX = "https://pypi.org/simple/arctic-inference/"
SDIST_NAME = "arctic_inference-0.3.0.tar.gz"


# ---------------------------------------------------------------------- the side environment
def side_python() -> Path:
    return SIDE_VENV / "bin" / "python"


def build_arctic() -> None:
    """Idempotent: the side venv, the sdist, and the compiled suffix_decoding/_C module."""
    if not side_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(SIDE_VENV)], check=True)
        subprocess.run([str(side_python()), "-m", "pip", "install", "-q", "nanobind==2.9.2", "cmake", "ninja", "numpy"],
                       check=True)
    if not SOURCE.exists():
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        index = urllib.request.urlopen(SIMPLE_INDEX, timeout=60).read().decode()
        links = [part.split('"')[0] for part in index.split('href="')[1:] if SDIST_NAME + "#" in part.split('"')[0]]
        if not links:
            raise SystemExit(f"no {SDIST_NAME} on {SIMPLE_INDEX}")
        archive = SDIST_DIR / SDIST_NAME
        urllib.request.urlretrieve(links[0].split("#")[0], archive)
        with tarfile.open(archive) as tar:
            tar.extractall(SDIST_DIR)
    package = SOURCE / "arctic_inference" / "suffix_decoding"
    if not list(package.glob("_C*.so")):
        bin_dir = SIDE_VENV / "bin"
        work = BUILD / "arctic-cmake"
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(bin_dir / "cmake"), str(SOURCE / "csrc" / "suffix_decoding"), "-GNinja",
                        f"-DCMAKE_MAKE_PROGRAM={bin_dir / 'ninja'}", f"-DPython_EXECUTABLE={side_python()}",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={package}"],
                       cwd=work, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(bin_dir / "cmake"), "--build", ".", "-j2"], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------------- traffic
def record(path: Path, models: Path, num_prompts: int, samples: int, new_tokens: int) -> list[dict]:
    """[{prompt, response}] in arrival order: per prompt `samples` samples at T = 0.8, then the
    same prompt with one line edited, greedy."""
    if path.exists():
        return json.loads(path.read_text())
    import random
    import torch
    import specdec
    sys.path.insert(0, str(ROOT))
    from benchmarks.prompts import heldout_files, stdlib_dir
    torch.set_num_threads(2)
    sd = specdec.load("prompt_lookup", **{"target.path": str(models / "target"),
                                         "target.tokenizer": str(models / "tokenizer")})
    split = models / "split.json"
    files = heldout_files(stdlib_dir(), str(split) if split.exists() else None, 0.1, 0)
    rng = random.Random(0)
    requests = []
    for k in range(num_prompts):
        while True:
            text = Path(stdlib_dir(), rng.choice(files)).read_text(errors="ignore")
            lines = text.splitlines(keepends=True)
            if len(lines) > 40:
                break
        start = rng.randrange(0, len(lines) - 20)
        prompt_lines = lines[start:start + 16]
        prompt = sd.tokenizer("".join(prompt_lines))["input_ids"][-192:]
        for s in range(samples):
            out = sd.generate(prompt, max_new_tokens=new_tokens, temperature=0.8, seed=s, sampler="coupled",
                              ignore_eos=True)
            requests.append({"prompt": prompt, "response": out.token_ids, "kind": f"sample {s}"})
        edited = list(prompt_lines)
        edited[len(edited) // 2] = "    # edited line\n"
        prompt = sd.tokenizer("".join(edited))["input_ids"][-192:]
        out = sd.generate(prompt, max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        requests.append({"prompt": prompt, "response": out.token_ids, "kind": "edited greedy"})
    path.write_text(json.dumps(requests))
    return requests


def accepted_length(tokens, parents, truth) -> int:
    """Longest root-to-node path of the draft (tokens, parents) equal to truth's first tokens."""
    best, depth_of = 0, {}
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        depth = 0 if parent < 0 else depth_of.get(parent, -1) + 1 if parent in depth_of else -1
        if depth >= 0 and depth < len(truth) and truth[depth] == token:
            depth_of[i] = depth
            best = max(best, depth + 1)
    return best


def replay(requests, propose, start, add_response, finish) -> dict:
    """Drive one proposer over the recorded requests; per-request accepted tokens per step."""
    steps = accepted = 0
    per_request = []
    for rid, request in enumerate(requests):
        prompt, response = request["prompt"], request["response"]
        start(rid, prompt)
        i = r_steps = r_accepted = 0
        while i < len(response):
            context = prompt + response[:i]
            tokens, parents = propose(rid, context, len(response) - i)
            n = accepted_length(tokens, parents, response[i:])
            new = response[i:i + n + 1]
            add_response(rid, new)
            i += len(new)
            r_steps += 1
            r_accepted += n
        finish(rid, response)
        steps += r_steps
        accepted += r_accepted
        per_request.append(r_accepted / r_steps)
    return {"accepted_per_step": accepted / steps, "steps": steps, "per_request": per_request}


ARCTIC_DRIVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from arctic_inference.suffix_decoding import SuffixDecodingCache
requests, budget = json.load(open(sys.argv[2])), json.loads(sys.argv[3])
cache = SuffixDecodingCache(max_tree_depth=budget["max_depth"], max_cached_requests=-1)
steps = accepted = 0
per_request = []
for rid, request in enumerate(requests):
    prompt, response = request["prompt"], request["response"]
    cache.start_request(rid, prompt)
    i = r_steps = r_accepted = 0
    while i < len(response):
        context = prompt + response[:i]
        draft = cache.speculate(rid, context, max_spec_tokens=min(budget["max_nodes"], len(response) - i),
                                max_spec_factor=budget["max_spec_factor"], max_spec_offset=0.0,
                                min_token_prob=budget["min_token_prob"], use_tree_spec=False)
        n = 0
        for token in draft.token_ids:
            if i + n < len(response) and response[i + n] == token:
                n += 1
            else:
                break
        new = response[i:i + n + 1]
        cache.add_active_response(rid, new)
        i += len(new)
        r_steps += 1
        r_accepted += n
    cache.stop_request(rid)
    steps += r_steps
    accepted += r_accepted
    per_request.append(r_accepted / r_steps)
print(json.dumps({"accepted_per_step": accepted / steps, "steps": steps, "per_request": per_request}))
"""


def run_arctic(requests_path: Path, budget: dict) -> dict:
    out = subprocess.run([str(side_python()), "-c", ARCTIC_DRIVER, str(SOURCE), str(requests_path), json.dumps(budget)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def run_ours(requests, budget: dict, tree: bool) -> dict:
    import torch
    from specdec.sampling import SamplingParams, TorchRandom
    from specdec.strategies.suffix import Suffix
    from specdec.types import DecodeState
    suffix = Suffix(max_depth=budget["max_depth"], max_nodes=budget["max_nodes"],
                    max_spec_factor=budget["max_spec_factor"], min_token_prob=budget["min_token_prob"], tree=tree,
                    min_match=1)                                # Arctic drafts from 1-token matches too
    state_box = {}

    def start(rid, prompt):
        state = DecodeState(token_ids=list(prompt), prompt_len=len(prompt), sampling=SamplingParams(0.0),
                            rng=TorchRandom(torch.Generator()), max_depth=budget["max_nodes"])
        suffix.reset(state)
        state_box["state"] = state

    def propose(rid, context, left):
        suffix.max_nodes = min(budget["max_nodes"], left)       # the same budget as Arctic's max_spec_tokens
        tokens, parents, _ = suffix.draft(context, max_levels=left)
        return tokens, parents

    def add_response(rid, new):
        state = state_box["state"]
        state.token_ids.extend(new)
        suffix.observe(state, None)

    def finish(rid, response):
        suffix.finish(state_box["state"])

    return replay(requests, propose, start, add_response, finish)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="../shared/models/pycode")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--max-depth", type=int, default=24)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--max-spec-factor", type=float, default=1.0)
    parser.add_argument("--min-token-prob", type=float, default=0.1)
    args = parser.parse_args()
    build_arctic()
    traffic = BUILD / f"suffix_replay_{args.prompts}x{args.samples}x{args.new}.json"
    requests = record(traffic, Path(args.models), args.prompts, args.samples, args.new)
    budget = {"max_depth": args.max_depth, "max_nodes": args.max_nodes, "max_spec_factor": args.max_spec_factor,
              "min_token_prob": args.min_token_prob}
    results = {"arctic (path)": run_arctic(traffic, budget), "ours (path)": run_ours(requests, budget, tree=False),
               "ours (tree)": run_ours(requests, budget, tree=True)}
    print(f"{len(requests)} requests, {sum(len(r['response']) for r in requests)} response tokens; budget {budget}")
    print(f"{'proposer':<16}{'accepted/step':>14}{'steps':>8}   per request (arrival order)")
    for name, result in results.items():
        per = " ".join(f"{x:.2f}" for x in result["per_request"])
        print(f"{name:<16}{result['accepted_per_step']:>14.3f}{result['steps']:>8}   {per}")
    ours, theirs = results["ours (path)"]["accepted_per_step"], results["arctic (path)"]["accepted_per_step"]
    print(f"ours (path) / arctic (path) = {ours / theirs:.3f}" + ("" if ours >= theirs else "  (BELOW arctic)"))


if __name__ == "__main__":
    main()
