"""One entry point: specdec generate | train-heads | bench."""
from __future__ import annotations

import argparse
import sys

from .errors import SpecDecError


def _generate(args) -> int:
    from .api import load
    overrides = [o for o in args.overrides]
    sd = load(args.config, **dict(o.split("=", 1) for o in _checked(overrides)))
    g = sd.config.generation
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    kwargs = dict(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                  seed=g.seed, stop=list(g.stop) or None)
    if args.no_stream:
        out = sd.generate(prompt, **kwargs)
        print(out.text)
        stats = out.stats
    else:
        sys.stdout.write(prompt if args.echo else "")
        # stream, then print the statistics of an identical (seeded) call's bookkeeping
        steps, stats = sd._run(prompt, kwargs["max_new_tokens"], kwargs["temperature"], kwargs["top_k"],
                               kwargs["top_p"], kwargs["seed"], kwargs["stop"], None, False)
        ids: list[int] = []
        shown = ""
        for run, _ in steps:
            ids.extend(run)
            text = sd.tokenizer.decode(ids, skip_special_tokens=True)
            if text.startswith(shown):
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
        print()
    print(f"[{sd.config.strategy}] {stats.new_tokens} tokens, {stats.target_forwards} target forwards, "
          f"{stats.tokens_per_forward:.2f} tokens/forward, {stats.tokens_per_second:.1f} tokens/s",
          file=sys.stderr)
    return 0


def _checked(overrides: list[str]) -> list[str]:
    from .errors import ConfigError
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"override {o!r} is not of the form key=value (e.g. draft.num_tokens=6)")
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for HF causal LMs")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with a strategy chosen by config")
    gen.add_argument("config", help="a shipped config name (autoregressive, draft_model, prompt_lookup, medusa, ...) or a YAML path")
    gen.add_argument("overrides", nargs="*", help="key=value overrides, e.g. target.path=... generation.max_new_tokens=64")
    gen.add_argument("--prompt", help="the prompt (default: read standard input)")
    gen.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    gen.add_argument("--no-stream", action="store_true", help="print the completion once, at the end")
    sub.add_parser("train-heads", help="train Medusa-style heads (or, with train_eagle, an EAGLE drafter) for a target model", add_help=False)
    sub.add_parser("bench", help="benchmark strategies against Hugging Face generate()", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("train-heads", "bench"):
        try:
            if argv[0] == "train-heads":
                from .heads.eagle_train import is_eagle_config
                if len(argv) > 1 and "=" not in argv[1] and is_eagle_config(argv[1]):
                    from .heads.eagle_train import main as sub_main      # e.g. `train-heads train_eagle`
                else:
                    from .heads.train import main as sub_main
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


if __name__ == "__main__":
    sys.exit(main())
