"""A server's rows over time: a client that closes its stream frees its row within a step and the
request queued behind it starts; admission past --max-queue is refused at once; /metrics counters only
grow, with accepted <= drafted and the per-position counts adding up to the accepted count; the engine's
live queue (decode_batch fed while it runs); `specdec serve` as a process stops cleanly on SIGINT and
SIGTERM; and the library imports without the server's extra."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

import openai
import pytest

from serve_helpers import post_json, request, scrape, target, tokenizer, wait_for
from specdec import Speculator
from specdec.batch import decode_batch
from specdec.loop import _Clock
from specdec.serve import Server
from specdec.strategies.autoregressive import Autoregressive
from zoo import strategies

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Slow(Autoregressive):
    """Plain decoding that sleeps 20 ms a step: a row stays in the batch long enough to be watched."""

    def propose(self, state):
        time.sleep(0.02)
        return super().propose(state)


def test_a_closed_stream_frees_its_row_and_the_queued_request_starts():
    sd = Speculator(target(), tokenizer(), Slow())
    with Server(sd, max_batch=1) as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
        stream = c.completions.create(model=server.model, prompt="def f(x):", max_tokens=400, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        assert server.engine.running == 1
        queued: dict = {}
        behind = threading.Thread(target=lambda: queued.update(
            out=c.completions.create(model=server.model, prompt="class A:", max_tokens=4, temperature=0)))
        behind.start()
        assert wait_for(lambda: server.engine.queued == 1), "the second request waits for the only slot"
        assert scrape(server.url)["specdec:num_requests_waiting"] == 1
        stream.close()                                  # the client goes away after 3 chunks
        behind.join(30)
        assert queued["out"].usage.completion_tokens == 4, "the queued request ran once the slot was free"
        assert wait_for(lambda: server.engine.running == 0)
        metrics = scrape(server.url)
        assert metrics['specdec:request_success_total{finished_reason="cancelled"}'] == 1
        assert metrics['specdec:request_success_total{finished_reason="length"}'] == 1
        assert metrics["specdec:generation_tokens_total"] < 400, "the closed stream stopped generating"


def test_a_client_that_leaves_a_whole_answer_frees_its_row():
    """Not streamed: the handler notices the closed connection while it waits, and cancels the row."""
    import json
    sd = Speculator(target(), tokenizer(), Slow())
    with Server(sd, max_batch=1) as server:
        conn = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": "def", "max_tokens": 400, "temperature": 0, "ignore_eos": True}).encode()
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert wait_for(lambda: server.engine.running == 1)
        conn.close()
        assert wait_for(lambda: server.engine.running == 0, timeout=10)
        assert scrape(server.url)['specdec:request_success_total{finished_reason="cancelled"}'] == 1


def test_a_request_past_the_queue_is_refused_at_once():
    sd = Speculator(target(), tokenizer(), Slow())
    with Server(sd, max_batch=1, max_queue=1) as server:
        body = {"prompt": "def", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        results = []
        threads = [threading.Thread(target=lambda: results.append(post_json(server.url, "/v1/completions", body)))
                   for _ in range(2)]
        for t in threads:
            t.start()
        assert wait_for(lambda: server.engine.running == 1 and server.engine.queued == 1)
        started = time.monotonic()
        status, error = post_json(server.url, "/v1/completions", body)
        assert time.monotonic() - started < 5, "refused at once, not queued"
        assert status == 503 and error["error"]["code"] == "queue_full"
        for t in threads:
            t.join(30)
        assert sorted(s for s, _ in results) == [200, 200]


def test_health_is_503_while_the_models_load():
    loaded = threading.Event()

    def load():
        loaded.wait(60)
        return Speculator(target(), tokenizer(), Autoregressive())

    with Server(load=load) as server:
        assert request(server.url, "GET", "/health") == (503, {"status": "loading"})
        status, body = post_json(server.url, "/v1/completions", {"prompt": "def", "max_tokens": 3})
        assert status == 503 and body["error"]["code"] == "loading"
        loaded.set()
        assert wait_for(lambda: request(server.url, "GET", "/health")[0] == 200)
        assert post_json(server.url, "/v1/completions", {"prompt": "def", "max_tokens": 3})[0] == 200


def test_health_says_when_loading_failed():
    def load():
        raise OSError("no such model folder")

    with Server(load=load) as server:
        assert wait_for(lambda: request(server.url, "GET", "/health")[1] != {"status": "loading"})
        status, body = request(server.url, "GET", "/health")
        assert status == 503 and body["status"] == "error" and "no such model folder" in body["message"]
        status, body = post_json(server.url, "/v1/completions", {"prompt": "def", "max_tokens": 3})
        assert status == 503 and body["error"]["code"] == "load_failed"


def test_auto_measures_its_batch_costs_before_serving(tmp_path, monkeypatch):
    """prepare_batches (what `specdec serve` calls at load): auto measures the verify costs of every
    batch bucket up to --max-batch then, so that no batch stalls on a measurement while serving."""
    from specdec import costmodel
    from specdec.strategies.auto import Auto
    from specdec.strategies.prompt_lookup import PromptLookup
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    model = target()
    strategy = Auto(PromptLookup(), None, profile=True, profile_context=8, max_nodes=4, profile_repeats=1)
    sd = Speculator(model, tokenizer(), strategy)
    measured = []
    real = costmodel.measure_verify_costs
    monkeypatch.setattr(costmodel, "measure_verify_costs", lambda *args, **kwargs: measured.append(
        kwargs.get("batch", args[4] if len(args) > 4 else 1)) or real(*args, **kwargs))
    sd.strategy.prepare_batches(5)
    assert sorted(measured) == [2, 4, 8] and sorted(strategy.batch_costs) == [2, 4, 8]
    sd.generate(["def f(x):", "class A:", "import os"], max_new_tokens=6)
    assert sorted(measured) == [2, 4, 8], "nothing is measured while generating"
    Autoregressive().prepare_batches(16)           # the default: nothing to prepare


@pytest.mark.parametrize("holder", ["auto", "sam"])
def test_the_tables_batch_costs_are_measured_before_serving_too(tmp_path, monkeypatch, holder):
    """token_recycling sizes its trees in a batch by the batch's verify costs: a strategy holding it (auto as its
    drafter, sam) prepares them with its own, so that generating a batch measures nothing."""
    from specdec import costmodel
    from specdec.strategies.auto import Auto
    from specdec.strategies.prompt_lookup import PromptLookup
    from specdec.strategies.sam import Sam
    from specdec.strategies.token_recycling import TokenRecycling
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    table = TokenRecycling(k=4, max_nodes=4, profile_context=8, profile_repeats=1)
    strategy = (Auto(PromptLookup(), table, profile=True, profile_context=8, max_nodes=4, profile_repeats=1)
                if holder == "auto" else Sam(PromptLookup(min_ngram=5, max_ngram=8), table))
    sd = Speculator(target(), tokenizer(), strategy)
    measured = []
    real = costmodel.measure_verify_costs
    monkeypatch.setattr(costmodel, "measure_verify_costs", lambda *args, **kwargs: measured.append(
        kwargs.get("batch", args[4] if len(args) > 4 else 1)) or real(*args, **kwargs))
    sd.strategy.prepare_batches(5)
    assert sorted(table.batch_costs) == [2, 4, 8] and measured
    before = list(measured)
    sd.generate(["def f(x):", "class A:", "import os"], max_new_tokens=6)
    assert measured == before, "nothing is measured while generating"


def test_metrics_only_grow_and_add_up():
    model = target()
    sd = Speculator(model, tokenizer(), strategies(model)["draft tree"]())

    def spec(m: dict) -> dict:
        return {k: v for k, v in m.items() if k.startswith("specdec:spec_decode")}

    with Server(sd) as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        snapshots = [scrape(server.url)]
        for i in range(3):
            out = c.completions.create(model=server.model, prompt="for i in range(10):\n", max_tokens=12 + 4 * i,
                                       temperature=0, stream=i == 1)
            if i == 1:
                list(out)
            snapshots.append(scrape(server.url))
    counters = [k for k in snapshots[-1] if k.endswith("_total") or "_total{" in k]
    assert any(k.startswith("specdec:spec_decode_num_accepted_tokens_per_pos_total") for k in counters)
    for before, after in zip(snapshots, snapshots[1:]):
        for key in counters:
            assert after[key] >= before.get(key, 0.0), key
    last = spec(snapshots[-1])
    drafted = last["specdec:spec_decode_num_draft_tokens_total"]
    accepted = last["specdec:spec_decode_num_accepted_tokens_total"]
    per_position = sum(v for k, v in last.items() if "per_pos" in k)
    assert drafted > 0 and accepted > 0, "the draft tree drafted, and some of it was accepted"
    assert accepted <= drafted
    assert per_position == accepted
    assert last["specdec:spec_decode_num_drafts_total"] > 0
    # position p counts steps that accepted more than p tokens: the counts never grow with the position
    by_position = [last[f'specdec:spec_decode_num_accepted_tokens_per_pos_total{{position="{p}"}}'] for p in range(4)]
    assert by_position == sorted(by_position, reverse=True)
    assert snapshots[-1]["specdec:time_to_first_token_seconds_count"] == 3


def test_the_engine_takes_jobs_that_arrive_while_it_runs():
    """decode_batch over a live deque: a job appended mid-run joins the batch, a cancelled waiting job
    never starts, a cancelled running one leaves with "cancelled" after its step; every other row equals
    its call alone."""
    model = target()
    sd = Speculator(model, tokenizer(), strategies(model)["draft chain"]())
    prompts = ["def f(x):", "class A:", "import os", "while x:"]
    alone = [sd.generate(p, max_new_tokens=10, temperature=0, ignore_eos=True).token_ids for p in prompts]
    jobs = [sd.batch_job(i, p, max_new_tokens=10 if i != 1 else 60, temperature=0, ignore_eos=True)
            for i, p in enumerate(prompts)]
    queue = deque(jobs[:2])
    tokens: dict = {i: [] for i in range(4)}
    reasons: dict = {}
    for n, step in enumerate(decode_batch(sd.verifier, sd.strategy, queue, 2, _Clock(sd.verifier.device))):
        for index, run, reason in step:
            tokens[index].extend(run)
            if reason is not None:
                reasons[index] = reason
        if n == 0:                      # two jobs arrive while the batch runs; one is cancelled before it starts
            queue.extend([jobs[3], jobs[2]])
            jobs[3].cancelled = True
        if n == 2:                      # the long row is cancelled mid-way
            jobs[1].cancelled = True
    assert tokens[0] == alone[0] and tokens[2] == alone[2]
    assert reasons == {0: "length", 1: "cancelled", 2: "length"}
    assert tokens[1] == sd.generate(prompts[1], max_new_tokens=60, temperature=0,
                                    ignore_eos=True).token_ids[:len(tokens[1])]
    assert 0 < len(tokens[1]) < 60
    assert tokens[3] == [] and 3 not in reasons


# ---------------------------------------------------------------------- `specdec serve` as a process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_process") / "target"
    target().save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def read_stream(url: str, body: dict, got: dict) -> None:
    """POST a streamed completion with a raw socket-level client, recording its events as they come."""
    import http.client
    import json
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        got["status"] = response.status
        got["events"] = []
        for line in response:
            if line.startswith(b"data: "):
                got["events"].append(line[6:].strip().decode())
    except Exception as exc:  # noqa: BLE001 - a stream cut by the shutdown is one of the allowed outcomes
        got["error"] = exc
    finally:
        conn.close()


def start_server(saved_target: str, *flags: str):
    """`specdec serve` in a process of its own on a free port, once /health answers 200: (process, url)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "specdec", "serve", "autoregressive",
                                f"target.path={saved_target}", "device=cpu", "--port", str(port),
                                "--log-level", "warning", *flags],
                               cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)

    def healthy():
        try:
            return request(url, "GET", "/health", timeout=2)[0] == 200
        except OSError:
            return process.poll() is not None
    if not (wait_for(healthy, timeout=120, every=0.2) and process.poll() is None):
        process.kill()
        raise AssertionError(f"the server did not come up: {process.communicate()}")
    return process, url


def stop_with(process, sig, got: dict, reader: threading.Thread) -> tuple[int, str]:
    """Send `sig` once the stream in flight has begun; (exit status, stderr)."""
    try:
        assert wait_for(lambda: len(got.get("events", [])) >= 2, timeout=60), got
        process.send_signal(sig)
        reader.join(120)
        code = process.wait(120)
        return code, process.communicate()[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_lets_the_request_in_flight_finish_then_stops(saved_target, sig):
    import json
    process, url = start_server(saved_target, "--shutdown-timeout", "300")
    got: dict = {}
    body = {"prompt": "def f(x):", "max_tokens": 120, "temperature": 0, "stream": True, "ignore_eos": True}
    reader = threading.Thread(target=read_stream, args=(url, body, got))
    reader.start()
    code, err = stop_with(process, sig, got, reader)
    assert code == 0, err
    assert got["events"][-1] == "[DONE]", got
    chunks = [json.loads(e) for e in got["events"][:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["specdec"]["verify_steps"] == 120, "the stream in flight ran to its end"
    with pytest.raises(OSError):          # nothing listens any more
        request(url, "GET", "/health", timeout=2)
    assert "Traceback" not in err, err


@pytest.mark.slow
def test_past_the_grace_period_a_request_in_flight_is_cut(saved_target):
    """--shutdown-timeout 0.5 and a long stream: the process still stops, exit 0, and the client sees its
    stream end without [DONE] (an error), not a hang."""
    process, url = start_server(saved_target, "--shutdown-timeout", "0.5")
    got: dict = {}
    body = {"prompt": "def f(x):", "max_tokens": 500, "temperature": 0, "stream": True, "ignore_eos": True}
    reader = threading.Thread(target=read_stream, args=(url, body, got))
    reader.start()
    started = time.monotonic()
    code, err = stop_with(process, signal.SIGTERM, got, reader)
    assert code == 0, err
    assert time.monotonic() - started < 60
    assert got.get("events") and got["events"][-1] != "[DONE]" or "error" in got, got


def test_the_library_imports_without_the_server_extra():
    """`import specdec` (and its CLI) never imports FastAPI, uvicorn, prometheus_client or openai; `specdec
    serve` without them names the extra to install."""
    code = ("import sys, specdec, specdec.cli, specdec.api, specdec.batch\n"
            "extras = ('fastapi', 'uvicorn', 'prometheus_client', 'openai', 'starlette')\n"
            "bad = [m for m in extras if m in sys.modules]\n"
            "assert not bad, bad\n"
            "class Block:\n"
            "    def find_spec(self, name, *a):\n"
            "        if name.split('.')[0] in ('fastapi', 'uvicorn', 'prometheus_client'): raise ImportError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from specdec.cli import main\n"
            "assert main(['serve', 'autoregressive']) == 2\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install 'specdec[serve]'" in result.stderr
