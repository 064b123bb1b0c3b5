"""What the command line tells a user: `--version`, each training config's keys in `train-heads
--help`, model path hints naming the key the command takes, and unknown keys answered with the
nearest key of the whole schema, section included."""
from __future__ import annotations

import dataclasses
import importlib.metadata

import pytest
import yaml

import specdec
from specdec.cli import main as cli_main
from specdec.config import find_config_file, load_spec_config
from specdec.errors import ConfigError
from specdec.heads.config import TrainHeadsConfig
from specdec.heads.eagle_train import TrainEagleConfig


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"specdec {importlib.metadata.version('specdec')}"
    assert specdec.__version__ == importlib.metadata.version("specdec")


def key_lines(text: str) -> dict[str, str]:
    """{key: value shown} of the `  key = value` lines of a help text."""
    lines = [line.strip().split(" = ", 1) for line in text.splitlines() if line.startswith("  ") and " = " in line]
    return {key.strip(): value for key, value in lines}


@pytest.mark.parametrize("name, schema", [("train_eagle", TrainEagleConfig), ("train_eagle3", TrainEagleConfig),
                                          ("train_heads", TrainHeadsConfig)])
def test_each_training_config_help_lists_its_own_keys_and_values(name, schema, capsys):
    assert cli_main(["train-heads", name, "--help"]) == 0
    shown = key_lines(capsys.readouterr().out)
    assert list(shown) == [f.name for f in dataclasses.fields(schema)]      # its keys, no other trainer's
    written = yaml.safe_load(open(find_config_file(name)))
    for key, value in written.items():                                        # the values the config gives
        assert yaml.safe_load(shown[key]) == value, key
    unset = next(f for f in dataclasses.fields(schema) if f.name not in written and f.default is not None
                 and f.default is not dataclasses.MISSING)
    assert yaml.safe_load(shown[unset.name]) == unset.default                 # and the defaults of the rest


def test_help_without_a_config_names_the_shipped_training_configs(capsys):
    assert cli_main(["train-heads", "--help"]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and " = " not in line}
    assert "EAGLE" in listed["train_eagle"] and "EAGLE" in listed["train_eagle3"] and "Medusa" in listed["train_heads"]
    assert "num_heads" in key_lines(out) and "ttt_steps" not in key_lines(out)


def test_help_after_overrides_is_still_help(capsys):
    assert cli_main(["train-heads", "train_eagle", "steps=3", "-h"]) == 0
    assert "ttt_steps" in key_lines(capsys.readouterr().out)


# ---------------------------------------------------------------------- model path hints
@pytest.mark.parametrize("config", [None, "eagle"])
def test_a_wrong_model_path_names_the_key_the_training_command_takes(config, tmp_path, capsys):
    args = ["train-heads"]
    if config == "eagle":
        path = tmp_path / "eagle.yaml"
        path.write_text("drafter: eagle\n")
        args.append(str(path))
    assert cli_main(args + [f"target={tmp_path / 'missing'}", f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "give target= the folder" in err and "target.path" not in err
    (tmp_path / "empty").mkdir()
    assert cli_main(args + [f"target={tmp_path / 'empty'}", f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "has no config.json" in err and "Give target= the folder" in err


def test_a_wrong_model_path_in_the_bench_names_models_target(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli_main(["bench", "quick", f"models.target={tmp_path / 'empty'}", f"output_dir={tmp_path / 'out'}"]) == 2
    assert "Give models.target= the folder" in capsys.readouterr().err


# ---------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize("key, nearest", [
    ("draft.num_node", "(did you mean 'draft.max_nodes' or 'draft.num_tokens'?)"),   # same section, two near names
    ("draft.num_token", "(did you mean 'draft.num_tokens'?)"),                       # a misspelling: named alone
    ("num_tokens", "(did you mean 'draft.num_tokens' or 'prompt_lookup.num_tokens' or 'early_exit.num_tokens'?)"),
    # a key without its section: every section that has it
    ("temperature", "(did you mean 'generation.temperature'?)"),
    ("draft.temperature", "(did you mean 'generation.temperature'?)"),               # a key in the wrong section
    ("drft", "(did you mean 'draft'?)"),
])
def test_unknown_key_names_the_nearest_key_with_its_section(key, nearest):
    with pytest.raises(ConfigError) as error:
        load_spec_config("draft_model", {key: 3})
    assert f"unknown config key {key!r} {nearest}" in str(error.value)


def test_unknown_key_far_from_every_key_lists_the_valid_ones():
    with pytest.raises(ConfigError) as error:
        load_spec_config("draft_model", {"xyzzy": 3})
    assert "did you mean" not in str(error.value) and "valid keys: strategy, " in str(error.value)
