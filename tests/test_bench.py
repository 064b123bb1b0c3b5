"""The benchmark harness end to end on tiny random models (the quick preset), plus its pieces."""
from __future__ import annotations

import json
import os

import pytest

from conftest import char_tokenizer, save_bench_family
from specdec.benchmarks.config import load_bench_config
from specdec.benchmarks.prompts import build_prompt_sets
from specdec.benchmarks.report import rewrite_marked_section
from specdec.benchmarks.run import main
from specdec.errors import ConfigError


@pytest.fixture(scope="module")
def tiny_family(tmp_path_factory):
    """A tiny Llama target and, as its draft, the target without its last layer (so drafts are
    partly accepted), saved as HF checkpoints with a character tokenizer."""
    return save_bench_family(tmp_path_factory.mktemp("family"))


@pytest.fixture(scope="module")
def quick_run(tiny_family, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    readme = out / "README.md"
    readme.write_text("# Benchmarks\n\nhand-written text stays\n")
    with pytest.MonkeyPatch.context() as mp:     # the auto row's cost profile lands in a temp folder
        mp.setenv("SPECDEC_HOME", str(out / "home"))
        code = _quick_main(tiny_family, out, readme)
    with open(out / "results.json") as fh:
        return code, json.load(fh), out


def _quick_main(tiny_family, out, readme):
    return main(["quick", f"models.target={tiny_family / 'target'}", f"models.draft={tiny_family / 'draft'}",
                 f"output_dir={out}", "progress=false", "threads=1", "write_readme=true", f"readme={readme}"])


def test_quick_preset_writes_every_output(quick_run):
    code, results, out = quick_run
    assert code == 0
    for name in ("results.json", "results.md", "speedup.png", "tokens_per_forward_sweep.png"):
        assert (out / name).stat().st_size > 0, name
    assert results["machine"]["torch"] and results["settings"]["max_new_tokens"] == 24
    readme = (out / "README.md").read_text()
    assert "hand-written text stays" in readme and "<!-- bench:quick:start -->" in readme
    assert "specdec bench quick" in readme and "speedup.png" in readme


def test_quick_preset_numbers_are_consistent(quick_run):
    _, results, _ = quick_run
    settings = results["settings"]
    labels = {row["label"] for row in results["rows"]}
    assert {"autoregressive", "HF generate()", "HF assistant (default)", "draft_model γ=4"} <= labels
    assert not any(label == "medusa" for label in labels)          # no heads given: skipped ...
    assert any("medusa" in note for note in results["notes"])      # ... with a note
    n_prompts = settings["prompts"]["num"] * len(settings["prompts"]["sets"])
    assert len(results["records"]) == len(labels) * n_prompts * len(settings["temperatures"])
    for record in results["records"]:
        assert record["new_tokens"] == settings["max_new_tokens"], record["row"]
        if record["stats"]:
            assert record["stats"]["new_tokens"] == record["new_tokens"]
            assert record["forwards"]["target_calls"] == record["stats"]["target_forwards"] + 1   # + prefill
    for entry in results["summary"]:
        assert entry["tokens_per_s"] > 0
        if entry["row"] in ("autoregressive", "HF generate()"):
            assert entry["tokens_per_forward"] == pytest.approx(1.0)
        if entry["row"] == "autoregressive":
            assert entry["speedup_vs_autoregressive"] == pytest.approx(1.0)
        if entry["time_split"]:
            assert sum(entry["time_split"].values()) == pytest.approx(1.0, abs=0.02)
            # the per-step milliseconds are the same parts: times the steps, they give the loop's times back
            stats = [r["stats"] for r in results["records"] if r["row"] == entry["row"]
                     and r["temperature"] == entry["temperature"] and r["prompt_set"] == entry["prompt_set"]]
            for part in ("draft", "verify", "other"):
                assert entry["step_ms"][part] * entry["target_forwards"] / 1000 == pytest.approx(
                    sum(s[f"{part}_time_s"] for s in stats))
            assert entry["nodes_per_step"] * entry["target_forwards"] == pytest.approx(sum(s["proposed_nodes"] for s in stats))
        else:
            assert entry["step_ms"] is None and entry["kind"] == "hf"


def test_quick_preset_greedy_outputs_match_hf(quick_run):
    _, results, _ = quick_run
    greedy = [r for r in results["records"] if r["temperature"] == 0]
    assert greedy and all(r["identical"] for r in greedy)
    assert all(r["identical"] is None for r in results["records"] if r["temperature"] > 0)
    assert results["identity_mismatches"] == 0


def test_grounded_prompts_repeat_their_own_text(tiny_family):
    cfg = load_bench_config("quick", ["prompts.num=2", "prompts.tokens=90"])
    tokenizer = char_tokenizer()
    sets = build_prompt_sets(cfg.prompts, tokenizer, 400)
    for prompt in sets["code"] + sets["grounded"]:
        assert len(prompt.token_ids) == 90
    repeat = next(p for p in sets["grounded"] if p.source["kind"] == "repeat")
    text = tokenizer.decode(repeat.token_ids)
    snippet, copy = text.split("\n\n# The same code again:\n")
    assert copy and snippet.startswith(copy)


def test_jsonl_prompts_and_their_errors(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n" + json.dumps({"prompt": "x = 1"}) + "\n")
    cfg = load_bench_config("quick", ["prompts.sets=[jsonl]", f"prompts.jsonl={path}", "prompts.num=5"])
    sets = build_prompt_sets(cfg.prompts, char_tokenizer(), 400)
    assert [len(p.token_ids) for p in sets["jsonl"]] == [len("def add(a, b):"), len("x = 1")]
    with pytest.raises(ConfigError, match="prompts.jsonl"):
        load_bench_config("quick", ["prompts.sets=[jsonl]"])
    with pytest.raises(ConfigError, match="valid keys"):
        load_bench_config("quick", ["prompts.count=3"])


def test_readme_section_is_replaced_not_duplicated(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n")
    rewrite_marked_section(str(readme), "full", "first table")
    rewrite_marked_section(str(readme), "full", "second table")
    text = readme.read_text()
    assert text.startswith("intro") and "second table" in text and "first table" not in text
    assert text.count("<!-- bench:full:start -->") == 1


@pytest.mark.parametrize("preset", ["quick", "full", "medusa_trees", "eagle", "repeat", "specbench", "early_exit",
                                    "layer_skip", "lookahead", "step_cost"])
def test_shipped_presets_load_and_name_known_strategy_configs(preset):
    from specdec.config import load_spec_config
    cfg = load_bench_config(preset, [])
    assert cfg.name == preset and cfg.strategies
    for entry in cfg.strategies:            # every row's config and overrides are valid
        load_spec_config(entry.config, list(entry.overrides))


def test_noise_prompts_are_shuffled_code_windows():
    cfg = load_bench_config("quick", ["prompts.num=2", "prompts.tokens=90", "prompts.sets=[code,noise]"])
    sets = build_prompt_sets(cfg.prompts, char_tokenizer(), 400)
    for code, noise in zip(sets["code"], sets["noise"]):
        assert len(noise.token_ids) == 90 and noise.source["kind"] == "shuffled"
    noise = sets["noise"][0]
    assert sorted(noise.token_ids) != noise.token_ids                 # not sorted, not the identity order
    again = build_prompt_sets(cfg.prompts, char_tokenizer(), 400)["noise"][0]
    assert again.token_ids == noise.token_ids                          # seeded


def test_batch_preset_runs_every_row_at_every_batch_size(tiny_family, tmp_path):
    """The batch benchmark end to end on tiny models: every row (ours and HF's batched generate())
    at each batch size and temperature, greedy outputs the same as our batched autoregressive."""
    out = tmp_path / "batch"
    code = main(["batch", f"models.target={tiny_family / 'target'}", f"models.draft={tiny_family / 'draft'}",
                 f"output_dir={out}", "prompts.num=2", "prompts.tokens=24", "max_new_tokens=8",
                 "batch_sizes=[1,3]", "warmup_tokens=2", "threads=1"])
    assert code == 0
    with open(out / "results.json") as fh:
        records = json.load(fh)["records"]
    labels = {r["row"] for r in records}
    assert {"autoregressive", "prompt_lookup", "HF generate() batched"} <= labels
    assert {(r["batch_size"], r["temperature"]) for r in records} == {(1, 0.0), (3, 0.0), (1, 0.8), (3, 0.8)}
    greedy = [r for r in records if r["temperature"] == 0]
    assert greedy and all(r["identical"] for r in greedy)
    assert all(r["new_tokens"] == 4 * 8 for r in records)          # 2 sets x 2 prompts x 8 tokens
    assert os.path.isfile(out / "batch_tokens_per_second.png") and "× HF batched" in (out / "results.md").read_text()


def test_samples_prompts_have_an_edited_copy_one_line_apart():
    cfg = load_bench_config("repeat", ["prompts.num=3", "prompts.tokens=200", "prompts.split=null"])
    tokenizer = char_tokenizer()
    prompts = build_prompt_sets(cfg.prompts, tokenizer, 400)["samples"]
    assert len(prompts) == 3
    for prompt in prompts:
        original, edited = tokenizer.decode(prompt.token_ids).split("\n"), tokenizer.decode(prompt.edited).split("\n")
        assert len(original) == len(edited)
        changed = [i for i, (a, b) in enumerate(zip(original, edited)) if a != b]
        assert changed == [prompt.source["edited_line"]]
    code = build_prompt_sets(load_bench_config("repeat", ["prompts.sets=[code]", "prompts.num=3", "prompts.tokens=200",
                                                          "prompts.split=null"]).prompts, tokenizer, 400)["code"]
    assert [p.token_ids for p in code] != [p.token_ids for p in prompts]     # a draw of its own


def test_samples_set_runs_in_arrival_order_and_reuse_shows_per_index(tiny_family, tmp_path):
    """The repeat preset end to end on tiny models: per prompt, its samples (seeds 0..) then its
    edited request; suffix's cache starts empty (warm-up forgotten) and fills from the second sample;
    the per-index table and plot are written; every output is checked (greedy vs HF, coupled vs AR)."""
    out = tmp_path / "repeat"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(tmp_path / "home"))
        code = main(["repeat", f"models.target={tiny_family / 'target'}", f"output_dir={out}", "prompts.num=2",
                     "prompts.tokens=40", "prompts.samples=3", "prompts.split=null", "max_new_tokens=12",
                     "warmup_tokens=4", "threads=1", "progress=false"])
    assert code == 0
    with open(out / "results.json") as fh:
        results = json.load(fh)
    assert any("eagle" in note for note in results["notes"])                # no drafter: skipped with a note
    suffix = [r for r in results["records"] if r["row"] == "suffix"]
    assert [(r["prompt_index"], r["sample_index"], r["temperature"], r["seed"]) for r in suffix] == [
        (0, 0, 0.8, 0), (0, 1, 0.8, 1), (0, 2, 0.8, 2), (0, 3, 0.0, 0),
        (1, 0, 0.8, 0), (1, 1, 0.8, 1), (1, 2, 0.8, 2), (1, 3, 0.0, 0)]
    assert all(r["identical"] for r in results["records"] if r["temperature"] == 0)
    coupled = [r for r in results["records"] if r["temperature"] > 0 and r["identical"] is not None]
    assert coupled and all(r["identical"] for r in coupled)
    by_index = results["samples_by_index"]
    assert set(by_index["suffix"]) == {"0", "1", "2", "2+", "edited"}
    assert by_index["autoregressive"]["2+"]["speedup_vs_autoregressive"] == pytest.approx(1.0)
    assert (out / "samples_speedup.png").stat().st_size > 0
    assert "per sample index" in (out / "results.md").read_text()


def test_forget_empties_suffix_caches_of_suffix_and_auto_rows(tiny_family):
    from omegaconf import OmegaConf
    from specdec.benchmarks.rows import build_specdec_rows
    from specdec.models import load_model, load_tokenizer
    target = load_model(str(tiny_family / "target"), "target", "cpu", "float32", key="t")
    tokenizer = load_tokenizer(str(tiny_family / "target"), "target", key="t")
    cfg = load_bench_config("repeat", [f"models.target={tiny_family / 'target'}"])
    entries = [e for e in cfg.strategies if e.label in ("suffix", "prompt_lookup")]
    entries.append(OmegaConf.structured({"label": "auto", "config": "auto", "overrides":
                                         ["auto.lookup_with=suffix", "auto.profile=false"], "needs": [],
                                         "sweep": None, "sweep_value": None}))
    rows = build_specdec_rows(entries, cfg.models, target, tokenizer, target.device, target.dtype, [])
    for row in rows:
        row.generate([1, 2, 3, 4, 5], 6, 0.0, 0)
    caches = [getattr(r.speculator.strategy, "cache", None) or r.speculator.strategy.lookup.cache
              for r in rows if r.label != "prompt_lookup"]
    assert all(c.stats()["entries"] == 1 for c in caches)
    for row in rows:
        row.forget()                       # prompt_lookup keeps nothing: a no-op there
    assert all(c.stats()["entries"] == 0 and c.stats()["tokens"] == 0 for c in caches)


NO_MATPLOTLIB = """
import importlib.abc, sys

class NoMatplotlib(importlib.abc.MetaPathFinder):     # as if matplotlib were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoMatplotlib())
import specdec, specdec.benchmarks.run, specdec.benchmarks.batch, specdec.benchmarks.plots
from specdec.cli import main
assert "matplotlib" not in sys.modules
sys.exit(main(["bench", "quick"]))
"""


def test_matplotlib_is_only_the_bench_extra(tmp_path):
    """The library and the benchmark modules import without matplotlib; `specdec bench` then stops at
    once (before any model is built or run) saying what to install."""
    import subprocess
    import sys
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("specdec bench: error: the benchmark plots need matplotlib, which "
                                                    "is not installed: pip install 'specdec[bench]'")
    assert not (tmp_path / "home").exists()          # no default family was built, nothing was measured


def test_pyproject_requires_neither_matplotlib_nor_einops():
    tomllib = pytest.importorskip("tomllib")          # Python 3.11+
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert not [r for r in project["dependencies"] if r.startswith(("matplotlib", "einops"))]
    assert [r for r in project["optional-dependencies"]["bench"] if r.startswith("matplotlib")]


def test_models_dir_fills_every_part_it_holds_and_its_split(tiny_family, tmp_path):
    """models.dir=DIR takes DIR/target and DIR/draft, and DIR/split.json as the prompts' held-out files;
    a part given by its own key wins over DIR's."""
    from specdec.benchmarks.run import _resolve_models
    family = tmp_path / "family"
    family.mkdir()
    for part in ("target", "draft"):
        os.symlink(tiny_family / part, family / part)
    (family / "split.json").write_text(json.dumps({"heldout": ["gzip.py"]}))
    cfg = load_bench_config("full", [f"models.dir={family}", f"models.draft={tiny_family / 'target'}"])
    _resolve_models(cfg.models, cfg.prompts)
    assert cfg.models.target == str(family / "target")
    assert cfg.models.draft == str(tiny_family / "target")
    assert cfg.models.heads is None and cfg.models.eagle is None
    assert cfg.prompts.split == str(family / "split.json")
    bad = load_bench_config("full", [f"models.dir={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="no target/ folder"):
        _resolve_models(bad.models, bad.prompts)


def test_no_shipped_config_names_a_folder_outside_the_package():
    """Shipped presets run anywhere: model folders come from models.dir / models.target overrides or
    the embedded default family, never from a path of the machine they were written on."""
    import glob
    import re
    import specdec.configs
    root = os.path.dirname(specdec.configs.__file__)
    offenders = []
    for path in glob.glob(os.path.join(root, "**", "*.yaml"), recursive=True):
        for number, line in enumerate(open(path), 1):
            value = line.split("#", 1)[0]
            if re.search(r"\.\./shared|:\s*/[A-Za-z]|(target|draft|heads|eagle|split):\s*\.\./", value):
                offenders.append(f"{os.path.relpath(path, root)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_rest_rows_need_a_datastore_from_the_models_or_their_own_overrides(tmp_path):
    """A rest row runs with models.datastore or a rest.datastore override of its own, and is skipped with a note
    saying how to make one otherwise; the Spec-Bench preset holds rest and lookahead rows."""
    import torch
    from conftest import tiny_model
    from specdec.benchmarks.config import ModelsConfig, StrategyEntry
    from specdec.benchmarks.rows import build_specdec_rows
    from specdec.strategies.datastore import build, tokenizer_fingerprint
    tokenizer = char_tokenizer()
    build([tokenizer("def parse(text):\n    return text\n")["input_ids"]], tmp_path / "store",
          tokenizer_fingerprint(tokenizer))
    target = tiny_model("llama", seed=0)
    entries = [StrategyEntry(label="rest", config="rest"),
               StrategyEntry(label="rest, own store", config="rest", overrides=[f"rest.datastore={tmp_path / 'store'}"]),
               StrategyEntry(label="needs one", config="prompt_lookup", needs=["datastore"])]
    for datastore, built in ((None, ["rest, own store"]), (str(tmp_path / "store"), [e.label for e in entries])):
        notes: list[str] = []
        rows = build_specdec_rows(entries, ModelsConfig(datastore=datastore), target, tokenizer, "cpu", torch.float32,
                                  notes)
        assert [row.label for row in rows] == built
        assert len(notes) == len(entries) - len(built)
        assert all("models.datastore=PATH" in note and "specdec index" in note for note in notes)
    preset = load_bench_config("specbench", [])
    assert {"rest", "lookahead"} <= {entry.label for entry in preset.strategies}
