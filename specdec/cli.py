"""One entry point: specdec generate | serve | train (train-heads, train-draft) | bench | check | profile | --version (also `python -m specdec ...`).
key=value overrides are parsed as YAML values by config.parse_overrides in every subcommand."""
from __future__ import annotations

import argparse
import sys

from .errors import SpecDecError
from .log import log_to_stderr


def _read_prompts_file(path: str) -> list[dict]:
    """A JSONL file of {"prompt": "...", and optionally "max_new_tokens", "seed", "stop"} lines."""
    import json
    from .errors import InputError
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [(n, line) for n, line in enumerate(fh, 1) if line.strip()]
    except OSError as exc:
        raise InputError(f"--prompts-file {path!r} cannot be read: {exc.strerror or exc}") from None
    rows = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"--prompts-file {path!r} line {n} is not JSON ({exc.msg}): each line must be an "
                             f"object like {{\"prompt\": \"def f(\"}}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise InputError(f"--prompts-file {path!r} line {n} has no \"prompt\" string: each line must be an object "
                             f"like {{\"prompt\": \"def f(\"}}")
        unknown = set(row) - {"prompt", "max_new_tokens", "seed", "stop"}
        if unknown:
            raise InputError(f"--prompts-file {path!r} line {n}: unknown key(s) {sorted(unknown)}; a line may hold "
                             f"prompt, max_new_tokens, seed and stop")
        rows.append(row)
    if not rows:
        raise InputError(f"--prompts-file {path!r} holds no prompts")
    return rows


def _generate_file(sd, args) -> int:
    """--prompts-file: every prompt through one batched call; one JSON line per prompt as it finishes
    (its index in the file, text, finish reason, stats), flushed at once so Ctrl-C keeps them."""
    import json
    rows = _read_prompts_file(args.prompts_file)
    defaults = sd.config.generation
    per_row = {key: [row.get(key, getattr(defaults, key)) for row in rows] for key in ("max_new_tokens", "seed")}
    stops = [row.get("stop", list(defaults.stop)) for row in rows]
    sink = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    written = 0

    def write(index, out):
        nonlocal written
        sink.write(json.dumps({"index": index, "text": out.text, "finish_reason": out.finish_reason,
                               "stats": out.stats.as_dict()}) + "\n")
        sink.flush()
        written += 1

    try:
        outs = sd.generate([row["prompt"] for row in rows], batch_size=args.batch_size, stop=stops,
                           on_output=write, progress=True, **per_row)
    except KeyboardInterrupt:
        print(f"specdec generate: interrupted (Ctrl-C) after {written} of {len(rows)} prompts; their lines are "
              f"written", file=sys.stderr)
        return 130
    finally:
        if sink is not sys.stdout:
            sink.close()
    stats = outs.stats
    print(f"[{sd.config.strategy}] {len(rows)} prompts, {stats.new_tokens} tokens, {stats.target_forwards} batched "
          f"target forwards, {stats.tokens_per_second:.1f} tokens/s", file=sys.stderr)
    return 0


def _generate(args) -> int:
    from .loading import load
    from .config import parse_overrides
    sd = load(args.config, **parse_overrides(args.overrides))
    if args.prompts_file:
        return _generate_file(sd, args)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if args.echo:
        sys.stdout.write(prompt)
    # sampling settings: the config's generation section (overrides included) is generate()'s default.
    # --no-stream runs the same stream and prints once, so Ctrl-C can still show the text so far.
    stream = sd.stream(prompt)
    printed = ""
    try:
        for piece in stream:
            if not args.no_stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
                printed += piece
    except KeyboardInterrupt:
        text = stream.text          # may hold what the interrupted step accepted but did not print
        stream.close()
        print(text[len(printed):] if text.startswith(printed) else "")
        sys.stdout.flush()
        print(f"specdec generate: interrupted (Ctrl-C) after {stream.stats.new_tokens} new tokens; the text above "
              f"is what was generated so far", file=sys.stderr)
        return 130
    print(stream.text[len(printed):])
    stats = stream.stats
    print(f"[{sd.config.strategy}] {stats.new_tokens} tokens, {stats.target_forwards} target forwards, "
          f"{stats.tokens_per_forward:.2f} tokens/forward, {stats.tokens_per_second:.1f} tokens/s, "
          f"finish reason: {stream.finish_reason}", file=sys.stderr)
    return 0


def _add_version(parser: argparse.ArgumentParser) -> None:
    """`specdec --version`: the installed package's version."""
    from . import __version__
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")


def main(argv: list[str] | None = None) -> int:
    log_to_stderr()                  # the library's progress messages (building the default family, ...)
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for HF causal LMs")
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with a strategy chosen by config")
    gen.add_argument("config", help="a shipped config name (autoregressive, draft_model, prompt_lookup, medusa, ...) or a YAML path")
    gen.add_argument("overrides", nargs="*", help="key=value overrides, values parsed as YAML, e.g. target.path=... "
                     "generation.max_new_tokens=64 draft.branching=[2,2,1] generation.stop=[return] generation.seed=null")
    gen.add_argument("--prompt", help="the prompt (default: read standard input)")
    gen.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    gen.add_argument("--no-stream", action="store_true", help="print the completion once, at the end")
    gen.add_argument("--prompts-file", help="a JSONL file, one {\"prompt\": ...} object a line (optionally "
                     "max_new_tokens, seed, stop): all run as one batch, one JSON line out per prompt")
    gen.add_argument("--batch-size", type=int, default=None, help="rows at once with --prompts-file (default 16)")
    gen.add_argument("--output", help="with --prompts-file: write the JSON lines here instead of standard output")
    sub.add_parser("train", help="train a drafter for a target model: medusa heads, an eagle drafter, a "
                   "distilled draft model, or the target itself for early_exit (`specdec train --help` lists each "
                   "one's keys)", add_help=False)
    sub.add_parser("train-heads", help="alias: specdec train medusa (or eagle, for a config with drafter: eagle)",
                   add_help=False)
    sub.add_parser("train-draft", help="alias: specdec train draft", add_help=False)
    sub.add_parser("bench", help="benchmark strategies against Hugging Face generate()", add_help=False)
    sub.add_parser("check", help="check losslessness and speed-up on your model", add_help=False)
    sub.add_parser("profile", help="measure the verify cost of n tree nodes on this machine (what `auto` plans with)",
                   add_help=False)
    sub.add_parser("export", help="write a trained drafter in a layout vLLM / other tools read", add_help=False)
    sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics) "
                   "with continuous batching (needs pip install 'specdec[serve]')", add_help=False)
    sub.add_parser("index", help="tokenize files into a REST datastore (specdec index FILES... --out DIR "
                   "--tokenizer TARGET)", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("train", "train-heads", "train-draft", "bench", "check", "profile", "export", "serve",
                            "index"):
        try:
            if argv[0] == "train":
                from .heads.command import train_main as sub_main   # medusa | eagle | draft | early-exit
            elif argv[0] == "train-heads":
                from .heads.command import main as sub_main      # Medusa heads, or EAGLE for `drafter: eagle`
            elif argv[0] == "train-draft":
                from .heads.command import draft_main as sub_main
            elif argv[0] == "check":
                from .check import main as sub_main
            elif argv[0] == "profile":
                from .profile import main as sub_main
            elif argv[0] == "export":
                from .interop.command import main as sub_main
            elif argv[0] == "serve":
                from .serve.command import main as sub_main
            elif argv[0] == "index":
                from .strategies.rest import index_main as sub_main
            else:
                from .benchmarks.run import main as sub_main
            return sub_main(argv[1:])
        except SpecDecError as exc:
            print(f"specdec {argv[0]}: error: {exc}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    try:
        return _generate(args)
    except SpecDecError as exc:
        print(f"specdec generate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:       # before generation began (loading, reading the prompt)
        print("specdec generate: interrupted (Ctrl-C) before generating", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
