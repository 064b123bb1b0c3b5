"""specdec serve STRATEGY key=value... [--host H] [--port P] [--api-key KEY] [--max-batch N] [--max-queue M]:
the configuration is `specdec generate`'s; the server answers /health with 503 while the models load,
then serves until SIGINT or SIGTERM (requests in flight get a grace period to finish)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from . import (DEFAULT_HOST, DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, DEFAULT_PORT, SHUTDOWN_GRACE_S, require_extra)

API_KEY_ENV = "SPECDEC_API_KEY"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec serve", description="an OpenAI-compatible server (/v1/completions, "
                                "/v1/chat/completions, /v1/models, /health, /metrics) over one loaded Speculator, "
                                "with continuous batching")
    p.add_argument("config", help="a shipped config name (autoregressive, draft_model, auto, ...) or a YAML path, as "
                   "for specdec generate")
    p.add_argument("overrides", nargs="*", help="key=value overrides, values parsed as YAML, e.g. target.path=... "
                   "generation.max_new_tokens=256 (a request's fields win over the generation: defaults)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this machine "
                   f"only; 0.0.0.0 for every interface, with --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}, else no key); "
                   f"/health and /metrics stay open")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help=f"rows (request choices) decoded at once (default {DEFAULT_MAX_BATCH})")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help=f"rows that may wait for a slot once the batch is full; past it a request is answered 503 "
                   f"at once (default {DEFAULT_MAX_QUEUE})")
    p.add_argument("--model-name", default=None, help="the model id /v1/models lists and requests name (default: "
                   "target.path, or 'specdec' for the embedded default family)")
    p.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_GRACE_S,
                   help=f"on SIGINT/SIGTERM, seconds the requests in flight get to finish before they are cut "
                   f"(default {SHUTDOWN_GRACE_S:g}; a second Ctrl-C cuts them at once)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (default info)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    require_extra()
    import uvicorn
    from ..config import load_spec_config, parse_overrides
    from ..loading import load
    from .app import create_app
    overrides = parse_overrides(args.overrides)
    # a request's seed means the same text whatever the strategy and the batch: the coupled sampler,
    # unless the command line says otherwise
    overrides.setdefault("generation.sampler", "coupled")
    config = load_spec_config(args.config, overrides)          # a bad key fails here, before any loading
    for name, value, low in (("--max-batch", args.max_batch, 1), ("--max-queue", args.max_queue, 0),
                             ("--port", args.port, 0)):
        if value < low:
            print(f"specdec serve: error: {name} must be >= {low}, got {value}", file=sys.stderr)
            return 2
    name = args.model_name or (str(config.target.path) if config.target.path else "specdec")
    failed: list[str] = []

    def on_load_error(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    def load_for_serving():
        speculator = load(args.config, **overrides)
        # what a strategy measures at its first batch of each size (auto's verify costs) happens before
        # /health says 200, not while a request waits
        speculator.strategy.prepare_batches(args.max_batch)
        return speculator

    app = create_app(load=load_for_serving, model_name=name, api_key=args.api_key,
                     max_batch=args.max_batch, max_queue=args.max_queue, on_load_error=on_load_error)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=args.shutdown_timeout))
    print(f"specdec serve: {config.strategy} as {name!r} on http://{args.host}:{args.port}/v1 (loading the models; "
          f"GET /health answers 200 once they are loaded)", file=sys.stderr, flush=True)
    run_until_signalled(server)
    if failed:
        print(f"specdec serve: error: loading failed: {failed[0]}", file=sys.stderr)
        return 2
    if not server.started:
        print(f"specdec serve: error: the server could not start on {args.host}:{args.port} (see the log above)",
              file=sys.stderr)
        return 1
    return 0


def run_until_signalled(server) -> None:
    """Run the uvicorn server in a thread while this (main) thread takes SIGINT and SIGTERM: the first
    stops accepting and lets the requests in flight finish (the engine stops after them), a second
    SIGINT cuts them. Not uvicorn's own handlers: after a graceful stop they raise the signal again,
    and the process would end as killed by it instead of with its exit status."""
    def on_signal(sig, frame):
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=server.run, name="specdec-serve")
    try:
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
