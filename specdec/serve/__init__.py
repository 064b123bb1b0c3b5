"""`specdec serve`: an OpenAI-compatible HTTP server over one Speculator, with continuous batching.

    specdec serve auto target.path=Qwen/Qwen2.5-0.5B-Instruct --port 8000

or, in Python (a notebook, a test), a server in a thread of this process:

    with specdec.serve.Server(sd) as server:
        openai.OpenAI(base_url=server.base_url, api_key="-").completions.create(model=server.model, prompt="def f(")

It needs the `serve` extra (FastAPI, uvicorn, prometheus_client): pip install 'specdec[serve]'. The
library itself never imports this package. Layout: engine.py (the batch's thread), protocol.py (request
checks), app.py (routes), metrics.py (Prometheus), command.py (the CLI)."""
from __future__ import annotations

import socket
import threading
import time

from ..errors import MissingDependencyError

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE = 16, 256
SHUTDOWN_GRACE_S = 10.0          # on SIGINT/SIGTERM, requests in flight get this long to finish


def require_extra() -> None:
    """Raise MissingDependencyError naming the extra when FastAPI, uvicorn or prometheus_client is missing."""
    missing = []
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingDependencyError(f"specdec serve needs {', '.join(missing)}: pip install 'specdec[serve]'")


def create_app(*args, **kwargs):
    """The FastAPI app (specdec.serve.app.create_app)."""
    require_extra()
    from .app import create_app as build
    return build(*args, **kwargs)


def model_name_of(speculator) -> str:
    """The model id /v1/models lists: the config's target.path, else "specdec"."""
    config = getattr(speculator, "config", None)
    path = getattr(getattr(config, "target", None), "path", None)
    return str(path) if path else "specdec"


class Server:
    """A server over `speculator` in a background thread of this process, on `host`:`port` (port 0: a
    free one; see .url). Use it as a context manager, or start() / stop(). Options: model_name,
    api_key, max_batch, max_queue, max_body_bytes, load (create_app's)."""

    def __init__(self, speculator=None, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning",
                 **options):
        require_extra()
        import uvicorn
        from .app import create_app as build
        options.setdefault("model_name", model_name_of(speculator))
        options.setdefault("max_batch", DEFAULT_MAX_BATCH)
        options.setdefault("max_queue", DEFAULT_MAX_QUEUE)
        self.model = options["model_name"]
        self.app = build(speculator, **options)     # or load=: a function whose Speculator is served once built
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level=log_level,
                                                     timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="specdec-serve", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client's base_url should be."""
        return self.url + "/v1"

    @property
    def engine(self):
        return self.app.state.specdec.engine

    def start(self, timeout: float = 30.0) -> "Server":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()
        state = self.app.state.specdec
        if state.engine is not None:
            state.engine.stop()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
