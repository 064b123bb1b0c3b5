"""`specdec bench serve`'s client side against a live server: every request of a level is answered
once, its tokens are the server's usage, and the latencies it reports are ordered (p50 <= p95)."""
from __future__ import annotations

from serve_helpers import target, tokenizer
from specdec import Speculator
from specdec.benchmarks.serve import one_request, run_level, write_results
from specdec.serve import Server
from specdec.strategies.prompt_lookup import PromptLookup

PROMPTS = ["def f(x):", "class A:", "import os", "for i in range(3):", "while x:"]


def test_a_level_answers_every_request_once(tmp_path):
    sd = Speculator(target(), tokenizer(), PromptLookup())
    offline = [sd.generate(p, max_new_tokens=6, temperature=0) for p in PROMPTS]
    with Server(sd) as server:
        single = one_request(server.port, None, PROMPTS[0], 6)
        assert single["tokens"] == len(offline[0].token_ids) and single["usage_reported"]
        level = run_level(server.port, None, PROMPTS, 2, 6)
    assert level["requests"] == len(PROMPTS) and not level["errors"]
    assert level["tokens"] == sum(len(o.token_ids) for o in offline)
    assert level["ttft_p50_s"] <= level["ttft_p95_s"] and level["tokens_per_s"] > 0
    write_results(str(tmp_path), {"rows": [{"server": "specdec serve prompt_lookup", **level},
                                           {"server": "other", "skipped": "not here"}],
                                  "offline_tokens_per_s": {"prompt_lookup": 1.0}})
    table = (tmp_path / "results.md").read_text()
    assert "| specdec serve prompt_lookup | 2 | 5 |" in table and "skipped: not here" in table
    assert (tmp_path / "serve.png").stat().st_size > 0
