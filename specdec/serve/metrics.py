"""GET /metrics: Prometheus counters, with vLLM's names under the `specdec:` prefix so that dashboards
built for vLLM read ours. The speculative ones are plain counters (vLLM's v1/spec_decode/metrics.py):
drafts, draft tokens, accepted tokens, accepted tokens per position; every rate (acceptance rate,
mean accepted length) is derived from them, nothing averaged is stored. Each server has a registry
of its own (two servers in one process, as in the tests, count apart)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..types import Stats
from .engine import SpecCounters

PREFIX = "specdec:"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                   80.0, 160.0)
POSITIONS = 16                     # accepted-per-position counters kept for positions 0..15 (deeper ones: 15)


class Metrics(SpecCounters):
    def __init__(self):
        self.registry = registry = CollectorRegistry()
        p = PREFIX
        self.running = Gauge(p + "num_requests_running", "Rows (request choices) in the batch now", registry=registry)
        self.waiting = Gauge(p + "num_requests_waiting", "Rows waiting for a slot in the batch", registry=registry)
        self.success = Counter(p + "request_success", "Rows finished, by finish reason", ["finished_reason"],
                               registry=registry)
        self.http = Counter(p + "http_requests", "HTTP requests answered, by route and status", ["route", "status"],
                            registry=registry)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of the rows admitted", registry=registry)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated", registry=registry)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Request latency, arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to the first token", buckets=LATENCY_BUCKETS,
                              registry=registry)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between two deliveries of tokens, per token",
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.drafts = Counter(p + "spec_decode_num_drafts", "Verify steps of a row that checked a draft",
                              registry=registry)
        self.draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Drafted tokens (tree nodes) verified",
                                    registry=registry)
        self.accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens", "Drafted tokens accepted",
                                       registry=registry)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos",
                                        "Drafted tokens accepted at each position of the accepted run",
                                        ["position"], registry=registry)
        for position in range(POSITIONS):      # every position shows, at 0, from the start
            self.accepted_per_pos.labels(position=str(position))

    def step(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.drafts.inc()
        self.draft_tokens.inc(drafted)
        if accepted:
            self.accepted_tokens.inc(accepted)
            for position in range(min(accepted, POSITIONS - 1)):
                self.accepted_per_pos.labels(position=str(position)).inc()
            if accepted >= POSITIONS:          # the last bucket holds every deeper position
                self.accepted_per_pos.labels(position=str(POSITIONS - 1)).inc(accepted - POSITIONS + 1)

    def finished(self, stats: Stats, reason: str) -> None:
        self.success.labels(finished_reason=reason).inc()
        self.generation_tokens.inc(stats.new_tokens)

    def watch(self, engine) -> None:
        """The gauges read the engine when scraped."""
        self.running.set_function(lambda: engine.running)
        self.waiting.set_function(lambda: engine.queued)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
