"""The demo's code path end to end on the minimal default family: every strategy's output is
identical to the target's own greedy generate(); model folders can be given instead."""
from __future__ import annotations

import os

import pytest

from specdec.family import demo
from specdec.errors import ModelLoadError

from test_default_family import write_minimal_yaml

MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def family_yaml(tmp_path_factory):
    """SPECDEC_HOME in a temp folder and the minimal family config as a YAML file."""
    folder = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(folder / "cache"))
        mp.delenv("SPECDEC_DEMO_MODELS", raising=False)
        mp.delenv("SPECDEC_DEMO_HEADS", raising=False)
        yield write_minimal_yaml(folder / "family.yaml")


def test_demo_rows_are_identical_to_greedy(family_yaml):
    models = demo.choose_models(family_config=family_yaml)
    assert models.heads is not None
    result = demo.run_demo(models, max_new_tokens=MAX_NEW_TOKENS, log=lambda msg: None)
    ran = [row.strategy for row in result.rows]
    assert ran[0] == "autoregressive"
    assert set(ran) | set(result.skipped) == set(demo.STRATEGIES)
    assert "draft_model" in ran
    for name, reason in result.skipped.items():      # only a module not written yet may be skipped
        assert "not available" in reason, (name, reason)
    assert len(result.reference_ids) == MAX_NEW_TOKENS
    for row in result.rows:
        assert row.identical, row.strategy
        assert row.new_tokens == MAX_NEW_TOKENS
        assert row.target_forwards >= 1
    baseline = result.rows[0]
    assert baseline.target_forwards == MAX_NEW_TOKENS and baseline.speedup == 1.0
    assert result.all_identical
    # the per-step split of the timed calls: every row verifies; plain decoding sends no tree, prompt lookup does
    # on this prompt (it repeats itself: its completion copies the prompt's lines)
    assert all(row.verify_ms > 0 for row in result.rows)
    assert baseline.nodes == 0
    lookup = next(row for row in result.rows if row.strategy == "prompt_lookup")
    assert lookup.nodes > 0 and lookup.nodes * lookup.target_forwards >= lookup.new_tokens - lookup.target_forwards


def test_demo_main_prints_the_table(family_yaml, capsys):
    code = demo.main(["--family-config", family_yaml, "--max-new-tokens", "6",
                      "--strategies", "autoregressive,prompt_lookup"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "autoregressive" in printed and "prompt_lookup" in printed
    assert printed.count("yes") == 2                 # one per row in the identical-to-greedy column


def test_demo_reports_a_row_that_differs(family_yaml, monkeypatch):
    """The identity column is a real check: a strategy that returns other tokens is caught."""
    import specdec.api
    real_generate = specdec.api.Speculator.generate

    def off_by_one(self, *args, **kwargs):
        out = real_generate(self, *args, **kwargs)
        if self.config.strategy == "prompt_lookup":
            out.token_ids = [(out.token_ids[0] + 1) % len(self.tokenizer)] + out.token_ids[1:]
        return out

    monkeypatch.setattr(specdec.api.Speculator, "generate", off_by_one)
    code = demo.main(["--family-config", family_yaml, "--max-new-tokens", "4",
                      "--strategies", "autoregressive,prompt_lookup"])
    assert code == 1


def test_models_folder_option(tmp_path, monkeypatch):
    for part in ("target", "draft"):
        os.makedirs(tmp_path / "family" / part)
    models = demo.choose_models(models_dir=str(tmp_path / "family"))
    assert models.target == str(tmp_path / "family" / "target")
    assert models.draft == str(tmp_path / "family" / "draft")
    assert models.heads is None
    assert "no Medusa heads" in demo.unavailable_reason("medusa", models)
    monkeypatch.setenv("SPECDEC_DEMO_MODELS", str(tmp_path / "family"))
    monkeypatch.setenv("SPECDEC_DEMO_HEADS", str(tmp_path / "heads"))
    from_env = demo.choose_models()
    assert from_env.target == models.target and from_env.heads == str(tmp_path / "heads")
    with pytest.raises(ModelLoadError, match="no target/ folder"):
        demo.choose_models(models_dir=str(tmp_path))


def test_strategies_must_start_with_the_baseline():
    assert demo.main(["--strategies", "draft_model,autoregressive"]) == 2
