"""`specdec train medusa|eagle|draft|early-exit`: one command for every trainer, the same training as its aliases
(`specdec train-heads`, `specdec train-draft`), --help listing each trainer's keys, and a shipped
config with no target training for the embedded default family."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from zoo import tiny_training_target
from specdec.cli import main as cli_main
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.config import TrainEagleConfig, TrainHeadsConfig
from specdec.heads.distill import TrainDraftConfig
from specdec.heads.early_exit_train import TrainEarlyExitConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_train_command")
    target, corpus = tiny_training_target(root)
    eagle_yaml = root / "eagle.yaml"            # a YAML with `drafter: eagle`: what `train-heads` dispatches on
    eagle_yaml.write_text("drafter: eagle\n")
    return {"target": target, "corpus": corpus, "eagle_yaml": str(eagle_yaml)}


def common(tiny) -> list[str]:
    corpus = tiny["corpus"]
    return [f"target={tiny['target']}", f"corpus=[{os.path.join(corpus, 'm0.py')},{os.path.join(corpus, 'm1.py')}]",
            f"heldout=[{os.path.join(corpus, 'm2.py')}]", "seq_len=24", "batch_size=2", "steps=2", "warmup_steps=1",
            "eval_interval=100", "eval_windows=2", "checkpoint_interval=100", "progress=false"]


KINDS = {  # kind: (its keys beyond the common ones, the alias command line, checkpoint file, output file)
    "medusa": (["num_heads=2"], ["train-heads"], "checkpoint.safetensors", "heads.json"),
    "eagle": (["layout=eagle1", "eval_new_tokens=8", "eval_depth=2", "ttt_steps=2"], ["train-heads", "EAGLE_YAML"],
              "eagle_checkpoint.safetensors", "eagle.json"),
    "draft": (["draft=null", "draft_config={hidden_size: 16, num_layers: 1, num_heads: 2}", "eval_prompts=1",
               "eval_prompt_tokens=8", "eval_new_tokens=8"], ["train-draft"], "draft_checkpoint.safetensors",
              "distill.json"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_train_kind_trains_what_its_alias_trains(kind, tiny, tmp_path, capsys):
    keys, alias, checkpoint_file, output_file = KINDS[kind]
    alias = [tiny["eagle_yaml"] if arg == "EAGLE_YAML" else arg for arg in alias]
    new, old = str(tmp_path / "new"), str(tmp_path / "alias")
    assert cli_main(["train", kind, *common(tiny), *keys, f"output_dir={new}"]) == 0
    assert cli_main([*alias, *common(tiny), *keys, f"output_dir={old}"]) == 0
    for folder in (new, old):
        assert os.path.isfile(os.path.join(folder, output_file))
    a, b = read_checkpoint(os.path.join(new, checkpoint_file)), read_checkpoint(os.path.join(old, checkpoint_file))
    assert a["kind"] == b["kind"] == {"medusa": "medusa", "eagle": "eagle", "draft": "draft"}[kind]
    assert a["step"] == b["step"] == 2 and len(a["losses"]) == 2
    assert a["module"].keys() == b["module"].keys()
    for name in a["module"]:                    # the same trainer, the same seeded run: the same weights
        assert torch.equal(a["module"][name], b["module"][name]), name


@pytest.mark.parametrize("kind, schema", [("medusa", TrainHeadsConfig), ("eagle", TrainEagleConfig),
                                          ("draft", TrainDraftConfig), ("early-exit", TrainEarlyExitConfig),
                                          ("mtp", TrainEagleConfig)])
def test_help_of_each_trainer_lists_its_keys_with_their_comments(kind, schema, capsys):
    assert cli_main(["train", kind, "--help"]) == 0
    out = capsys.readouterr().out
    keys = [line.split("=")[0].strip() for line in out.splitlines() if line.startswith("  ") and " = " in line]
    assert keys == [f.name for f in dataclasses.fields(schema)]
    assert any(line.strip().startswith("target ") and "# Hugging Face checkpoint folder" in line
               for line in out.splitlines())


def test_help_without_a_trainer_lists_every_trainer(capsys):
    assert cli_main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for kind in [*KINDS, "early-exit", "mtp"]:
        assert f"specdec train {kind} [CONFIG]" in out
    for key in ("num_heads", "ttt_steps", "mix_lambda", "layer_dropout_max"):   # one key of each trainer's own
        assert f"  {key} " in out


def test_a_wrong_trainer_or_config_is_an_error_that_says_what_to_run(capsys):
    assert cli_main(["train", "medusae", "steps=2"]) == 2
    assert "medusa, eagle, draft" in capsys.readouterr().err
    assert cli_main(["train", "medusa", "train_eagle", "steps=2"]) == 2
    assert "specdec train eagle train_eagle" in capsys.readouterr().err
    assert cli_main(["train", "mtp", "train_eagle", "target=x", "steps=2"]) == 2
    assert "trains layout=mtp, and this config sets layout=eagle1" in capsys.readouterr().err


# ---------------------------------------------------------------------- no target: the default family
SMALL = ["seq_len=32", "batch_size=2", "steps=2", "warmup_steps=1", "eval_interval=100", "eval_windows=2",
         "checkpoint_interval=100", "progress=false"]


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """A minimal default family (test_default_family's), built once, as $SPECDEC_HOME / $SPECDEC_FAMILY_CONFIG name it."""
    from specdec.family import ensure_family, load_family_config
    from test_default_family import write_minimal_yaml
    root = tmp_path_factory.mktemp("family_for_training")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(root / "cache"))
        mp.setenv("SPECDEC_FAMILY_CONFIG", write_minimal_yaml(root / "family.yaml"))
        paths = ensure_family(load_family_config(os.environ["SPECDEC_FAMILY_CONFIG"]))
        yield paths, dict(os.environ)


@pytest.mark.parametrize("command", [["train-heads", "train_heads"], ["train", "medusa", "train_heads"]])
def test_a_shipped_config_without_a_target_trains_for_the_default_family(command, family, tmp_path, monkeypatch):
    paths, env = family
    for name in ("SPECDEC_HOME", "SPECDEC_FAMILY_CONFIG"):
        monkeypatch.setenv(name, env[name])
    out = str(tmp_path / "heads")
    assert cli_main([*command, *SMALL, "num_heads=2", f"output_dir={out}"]) == 0
    saved = read_checkpoint(os.path.join(out, "checkpoint.safetensors"))
    assert saved["target"]["path"] == os.path.abspath(paths.target) and saved["step"] == 2
    log = json.load(open(os.path.join(out, "train.json")))
    split = json.load(open(os.path.join(paths.tokenizer, "split.json")))
    assert log["config"]["split_file"] == os.path.join(paths.tokenizer, "split.json")
    assert log["config"]["corpus_root"] == split["root"]
    assert (log["train_files"], log["heldout_files"]) == (len(split["train"]), len(split["heldout"]))
    assert os.path.isfile(os.path.join(out, "heads.json"))


def test_a_draft_config_without_a_target_distils_the_default_familys_draft(family, tmp_path, monkeypatch):
    paths, env = family
    for name in ("SPECDEC_HOME", "SPECDEC_FAMILY_CONFIG"):
        monkeypatch.setenv(name, env[name])
    out = str(tmp_path / "draft")
    assert cli_main(["train", "draft", "train_draft", *SMALL, "max_minutes=null", "prompt_tokens=8",
                     "eval_prompts=1", "eval_prompt_tokens=8", "eval_new_tokens=8", f"output_dir={out}"]) == 0
    info = json.load(open(os.path.join(out, "distill.json")))
    assert info["target"]["path"] == os.path.abspath(paths.target) and info["recipe"]["draft"] == paths.draft


def test_an_early_exit_config_without_a_target_fine_tunes_the_default_familys_target(family, tmp_path, monkeypatch):
    paths, env = family
    for name in ("SPECDEC_HOME", "SPECDEC_FAMILY_CONFIG"):
        monkeypatch.setenv(name, env[name])
    out = str(tmp_path / "early_exit")
    assert cli_main(["train", "early-exit", "train_early_exit", *SMALL, "bf16=false", f"output_dir={out}"]) == 0
    saved = read_checkpoint(os.path.join(out, "early_exit_checkpoint.safetensors"))
    assert saved["target"]["path"] == os.path.abspath(paths.target) and saved["step"] == 2
    info = json.load(open(os.path.join(out, "target", "early_exit.json")))
    assert info["fine_tuned_from"]["path"] == os.path.abspath(paths.target)
    log = json.load(open(os.path.join(out, "train_early_exit.json")))
    assert log["config"]["split_file"] == os.path.join(paths.tokenizer, "split.json")


def test_a_given_target_is_kept(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "no-family-here"))
    out = str(tmp_path / "heads")
    assert cli_main(["train", "medusa", *common(tiny), "num_heads=2", f"output_dir={out}"]) == 0
    assert read_checkpoint(os.path.join(out, "checkpoint.safetensors"))["target"]["path"] == tiny["target"]
    assert not os.path.exists(tmp_path / "no-family-here")            # nothing was built
