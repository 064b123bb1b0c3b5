"""`specdec check`: passes on a correct strategy, FAILS (identity and chi-square verdicts, exit
status 1) when acceptance is broken; the chi-square p-value and the tie rule on known cases."""
from __future__ import annotations

import math
from collections import Counter
from unittest import mock

import pytest
import torch

from conftest import char_tokenizer, tiny_model
from law import always_accept
from specdec import Speculator
from specdec.acceptance import Verdict
from specdec.check import check, chi_square, chi_square_p_value, main, tie_at
from specdec.strategies.draft_model import DraftModel

PROMPTS = [[5, 17, 33, 9, 41, 60, 70], [8, 8, 21, 40]]
TARGET = tiny_model("llama", seed=0, sharpen=4.0)
DRAFT = tiny_model("llama", seed=1, sharpen=4.0)
FAST = dict(max_new_tokens=16, runs=120, sample_tokens=3)


def keep_first_children(tree, target_argmax, tree_tokens=None):
    """A broken greedy acceptance: keeps every first child whatever the target says."""
    accepted, node = [], -1
    while tree.children(node):
        node = tree.children(node)[0]
        accepted.append(node)
    return Verdict(tuple(accepted), target_argmax[node + 1])


def test_check_passes_on_a_correct_strategy():
    sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=3))
    report = check(sd, PROMPTS, **FAST)
    assert [r.divergence for r in report.identity] == [None, None]
    assert report.law.dof >= 2 and report.law.impossible == 0
    assert report.law.p_value >= report.law.alpha
    assert report.speed.new_tokens == 32 and report.speed.target_forwards > 0
    assert report.passed


def test_check_fails_when_acceptance_is_broken():
    sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=3))
    with mock.patch("specdec.loop.accept_greedy", keep_first_children), \
            mock.patch("specdec.loop.accept_sampling", always_accept):
        report = check(sd, PROMPTS, speed=False, **FAST)
    first = report.identity[0]
    assert first.divergence is not None and first.tie is False and not first.passed
    assert first.logit_gap > first.resolution
    assert not report.law.passed and report.law.p_value < 1e-6
    assert not report.passed


def test_chi_square_p_value_known_values():
    assert chi_square_p_value(3.0, 2) == pytest.approx(math.exp(-1.5), rel=1e-9)   # dof 2: exp(-x/2)
    assert chi_square_p_value(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-6)
    assert chi_square_p_value(0.0, 3) == pytest.approx(1.0)


def test_chi_square_pools_small_cells_and_counts_impossible_outcomes():
    law = {(1, 1): 0.5, (1, 2): 0.3, (2, 1): 0.19, (2, 2): 0.01}
    exact = Counter({(1, 1): 50, (1, 2): 30, (2, 1): 19, (2, 2): 1})
    statistic, dof, p, impossible = chi_square(exact, law, 100)
    assert statistic == pytest.approx(0.0) and dof == 2 and p == pytest.approx(1.0) and impossible == 0
    wrong = Counter({(1, 1): 20, (1, 2): 60, (2, 1): 19, (3, 3): 1})
    statistic, dof, p, impossible = chi_square(wrong, law, 100)
    assert impossible == 1 and p < 1e-6


def test_tie_rule():
    model = tiny_model("llama", seed=3)
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        head.weight[11] = head.weight[10]                  # tokens 10 and 11: equal logits everywhere
    gap, resolution = tie_at(model, [5, 6, 7], 10, 11)
    assert gap <= resolution
    gap, resolution = tie_at(model, [5, 6, 7], 10, 12)
    assert gap > resolution


@pytest.fixture
def saved_model(tmp_path):
    TARGET.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    return str(tmp_path)


def test_cli_check_exit_status(saved_model, capsys):
    argv = ["check", "prompt_lookup", f"target.path={saved_model}", "device=cpu", "dtype=float32",
            "--prompt", "abcabcabcab", "--max-new-tokens", "12", "--runs", "60", "--no-speed"]
    from specdec.cli import main as cli_main
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "identical" in out and "PASSED" in out and "chi-square" in out
    with mock.patch("specdec.loop.accept_greedy", keep_first_children), \
            mock.patch("specdec.loop.accept_sampling", always_accept):
        assert main(argv[1:]) == 1
    out = capsys.readouterr().out
    assert "NOT a tie" in out and "FAILED" in out
    assert main(["prompt_lookup", f"target.path={saved_model}", "device=cpu", "no_equals_sign"]) == 2


@pytest.mark.parametrize("name", ["token_recycling", "rest"])
def test_specdec_check_passes_through_the_training_free_drafters_and_fails_when_acceptance_is_broken(
        name, tmp_path, capsys):
    """`specdec check token_recycling|rest ...`: identity and the sampling law hold; with an acceptance that keeps
    every first child whatever the target says, the check fails."""
    from specdec.strategies.datastore import build, tokenizer_fingerprint
    tokenizer = char_tokenizer()
    tiny_model("llama", seed=0, sharpen=4.0).save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    build([tokenizer("abcabcabcabcabd" * 4)["input_ids"]], tmp_path / "store", tokenizer_fingerprint(tokenizer))
    extra = [f"rest.datastore={tmp_path / 'store'}", "rest.min_match=1"] if name == "rest" else []
    argv = ["check", name, f"target.path={tmp_path / 'target'}", "device=cpu", "dtype=float32", *extra,
            "--prompt", "abcabcabcab", "--max-new-tokens", "12", "--runs", "60", "--no-speed"]
    check_passes_and_fails_when_acceptance_is_broken(argv, capsys)


def check_passes_and_fails_when_acceptance_is_broken(argv: list[str], capsys) -> None:
    """`specdec` with `argv` (a check) passes; with an acceptance that keeps every first child whatever the target
    says, and a sampler that accepts every draft, it fails."""
    from specdec.cli import main as cli_main
    assert cli_main(argv) == 0
    assert "PASSED" in capsys.readouterr().out
    with mock.patch("specdec.loop.accept_greedy", keep_first_children), \
            mock.patch("specdec.loop.accept_sampling", always_accept):
        assert cli_main(argv) == 1
    assert "FAILED" in capsys.readouterr().out
