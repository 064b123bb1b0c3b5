"""Training checkpoints (heads/checkpoint.py) hold safetensors and JSON, never a pickle: a resumed
run goes on bit-exactly; a pickle planted in an output folder (where earlier versions kept their
checkpoint, or under the new name) is refused for every trainer without being unpickled; a
checkpoint of another trainer or of another target is refused with a message naming both."""
from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import char_tokenizer, tiny_model
from specdec.cli import main as cli_main
from specdec.errors import ConfigError, ModelLoadError
from specdec.heads import distill, eagle_train, train
from specdec.heads.checkpoint import FORMAT, load_checkpoint, read_checkpoint, save_checkpoint

TARGET = {"path": "/models/a", "architecture": "LlamaForCausalLM", "hidden_size": 8, "vocab_size": 16,
          "fingerprint": [0.5 + i for i in range(16)]}


class Planted:
    """An object whose unpickling creates the file `marker`: what a hostile checkpoint would run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


# ---------------------------------------------------------------------- the file itself
class Tied(torch.nn.Module):
    """Parameters, a tied weight (one storage under two names) and integer / boolean buffers."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("ids", torch.arange(5, dtype=torch.long))
        self.register_buffer("mask", torch.tensor([True, False, True]))

    def forward(self, ids):
        return self.head(torch.tanh(self.body(self.embed(ids))))


def _train_step(module, optimizer, generator):
    ids = torch.randint(0, 16, (4, 6), generator=generator)
    loss = torch.nn.functional.cross_entropy(module(ids).flatten(0, 1), ids.roll(1, dims=1).flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _fresh(seed: int):
    torch.manual_seed(seed)
    module = Tied()
    return module, torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1), torch.Generator()


def test_a_resumed_run_goes_on_bit_exactly_from_a_file_with_no_pickle(tmp_path):
    module, optimizer, generator = _fresh(0)
    generator.manual_seed(7)
    for _ in range(3):
        _train_step(module, optimizer, generator)
    path = str(tmp_path / "checkpoint.safetensors")
    save_checkpoint(path, "medusa", module, optimizer, generator, TARGET, {"num_heads": 2, "layers": (1, 2)},
                    step=3, history=[{"step": 0, "loss": 2.5}], losses=[2.7, 2.6, 2.55])

    with open(path, "rb") as f:
        head = f.read(8)
    assert head[:2] != b"PK" and int.from_bytes(head, "little") < os.path.getsize(path)   # a safetensors header
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    info = json.loads(metadata["checkpoint"])
    assert metadata["format"] == FORMAT and info["kind"] == "medusa" and info["target"] == TARGET

    other, other_optimizer, other_generator = _fresh(1)            # other weights, no optimizer state yet
    progress = load_checkpoint(path, "medusa", other, other_optimizer, other_generator, TARGET,
                               {"num_heads": 2, "layers": (1, 2)})
    assert progress == {"step": 3, "history": [{"step": 0, "loss": 2.5}], "losses": [2.7, 2.6, 2.55]}
    assert other.head.weight is other.embed.weight                  # still tied after loading
    assert other_optimizer.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    for _ in range(2):                                              # both go on identically
        assert _train_step(other, other_optimizer, other_generator) == _train_step(module, optimizer, generator)
    for name, value in module.state_dict().items():
        assert torch.equal(value, other.state_dict()[name]), name
    assert torch.equal(generator.get_state(), other_generator.get_state())


def test_another_kind_target_layout_or_shape_is_refused_naming_both(tmp_path):
    module, optimizer, generator = _fresh(0)
    path = str(tmp_path / "checkpoint.safetensors")
    save_checkpoint(path, "medusa", module, optimizer, generator, TARGET, {"num_heads": 2})
    with pytest.raises(ConfigError, match=r"(?s)training Medusa heads.*this run trains an EAGLE drafter.*delete"):
        load_checkpoint(path, "eagle", *_fresh(1), TARGET, {"num_heads": 2})
    other = {**TARGET, "path": "/models/b", "fingerprint": [-x for x in TARGET["fingerprint"]]}
    with pytest.raises(ConfigError, match=r"(?s)for the target /models/a .*this run's target is /models/b "):
        load_checkpoint(path, "medusa", *_fresh(1), other, {"num_heads": 2})
    with pytest.raises(ConfigError, match=r"layout \{'num_heads': 2\}.*asks for \{'num_heads': 3\}"):
        load_checkpoint(path, "medusa", *_fresh(1), TARGET, {"num_heads": 3})
    wide = torch.nn.Linear(8, 9)
    with pytest.raises(ConfigError, match="another shape"):
        load_checkpoint(path, "medusa", wide, torch.optim.AdamW(wide.parameters()), torch.Generator(), TARGET)
    moved = {**TARGET, "path": "/elsewhere/a"}                      # the same weights moved: accepted
    assert load_checkpoint(path, "medusa", *_fresh(1), moved, {"num_heads": 2}) == {}


def test_files_that_are_not_checkpoints_are_clear_errors(tmp_path):
    module, optimizer, generator = _fresh(0)
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(str(path), "eagle", module, optimizer, generator, TARGET)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="corrupt or truncated.*delete"):
        read_checkpoint(str(path))
    save_file({"w": torch.ones(2)}, str(path))                      # safetensors, but some model's weights
    with pytest.raises(ModelLoadError, match="not a specdec training checkpoint"):
        read_checkpoint(str(path))


# ---------------------------------------------------------------------- the three trainers
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_checkpoint")
    for name, seed in (("target", 0), ("other", 1)):                 # two targets, one tokenizer
        tiny_model("llama", seed=seed, sharpen=3.0).save_pretrained(root / name)
        char_tokenizer().save_pretrained(root / name)
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} - {i}\n" for j in range(30)))
    return {"target": str(root / "target"), "other": str(root / "other"), "corpus": str(corpus)}


TRAINERS = {"medusa": train, "eagle": eagle_train, "draft": distill}


def _run(kind: str, tiny: dict, out, target: str = "target", **overrides) -> str:
    """Train `kind` for two steps (tiny sizes) for `target` into `out`, or resume it there."""
    base = {"target": tiny[target], "output_dir": str(out), "seq_len": 24, "batch_size": 2, "steps": 2,
            "warmup_steps": 1, "eval_interval": 100, "eval_windows": 2, "checkpoint_interval": 100,
            "progress": False, "corpus": [os.path.join(tiny["corpus"], f"m{i}.py") for i in range(2)],
            "heldout": [os.path.join(tiny["corpus"], "m2.py")]}
    if kind == "medusa":
        return train.train_heads(train.load_train_config(None, {**base, "num_heads": 2, **overrides}))
    if kind == "eagle":
        return eagle_train.train_eagle(eagle_train.load_train_eagle_config(None, {
            **base, "layout": "eagle1", "eval_new_tokens": 8, "eval_depth": 2, "ttt_steps": 2, **overrides}))
    return distill.train_draft(distill.load_train_draft_config(None, {
        **base, "draft_config": {"hidden_size": 16, "num_layers": 1, "num_heads": 2}, "eval_prompts": 0,
        **overrides}))


@pytest.mark.parametrize("kind", list(TRAINERS))
@pytest.mark.parametrize("where", ["old name", "new name"])
def test_a_planted_pickle_is_refused_and_never_unpickled(kind, where, tiny, tmp_path):
    marker = tmp_path / "unpickled"
    out = tmp_path / "out"
    out.mkdir()
    trainer = TRAINERS[kind]
    if where == "old name":        # where earlier versions kept their checkpoint: torch.save's zip archive
        planted = out / trainer.LEGACY_CHECKPOINT_FILE
        torch.save({"step": 1, "history": [], "module": Planted(str(marker))}, planted)
    else:                          # a bare pickle under the new checkpoint's name
        planted = out / trainer.CHECKPOINT_FILE
        planted.write_bytes(pickle.dumps({"step": 1, "module": Planted(str(marker))}, protocol=4))
    with pytest.raises(ModelLoadError) as refused:
        _run(kind, tiny, out)
    message = str(refused.value)
    assert str(planted) in message and "pickle" in message and "not loaded" in message
    assert "delete" in message and "output_dir" in message
    assert not marker.exists()
    assert sorted(os.listdir(out)) == [planted.name]                # nothing trained, nothing written

    if where == "old name":                                         # the plant is live: unpickling it runs its code
        torch.load(planted, weights_only=False)
    else:
        pickle.loads(planted.read_bytes())
    assert marker.exists()


@pytest.mark.parametrize("made_by,resumed_by", [("medusa", "eagle"), ("eagle", "draft"), ("draft", "medusa")])
def test_a_checkpoint_of_another_trainer_is_refused_naming_both(made_by, resumed_by, tiny, tmp_path):
    _run(made_by, tiny, tmp_path / "made")
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copy(tmp_path / "made" / TRAINERS[made_by].CHECKPOINT_FILE, out / TRAINERS[resumed_by].CHECKPOINT_FILE)
    names = {"medusa": "Medusa heads", "eagle": "an EAGLE drafter", "draft": "a draft model"}
    with pytest.raises(ConfigError, match=f"training {names[made_by]} .*this run trains {names[resumed_by]} "):
        _run(resumed_by, tiny, out, steps=3)


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_a_checkpoint_for_another_target_is_refused_naming_both(kind, tiny, tmp_path):
    out = tmp_path / "out"
    _run(kind, tiny, out)
    checkpoint = out / TRAINERS[kind].CHECKPOINT_FILE
    before = checkpoint.read_bytes()
    with pytest.raises(ConfigError) as refused:
        _run(kind, tiny, out, target="other", steps=3)
    message = str(refused.value)
    assert f"for the target {tiny['target']} (LlamaForCausalLM" in message
    assert f"this run's target is {tiny['other']} (LlamaForCausalLM" in message
    assert "use another output_dir, or delete" in message
    assert checkpoint.read_bytes() == before                        # left as it was
    assert read_checkpoint(str(checkpoint))["step"] == 2


def test_the_reported_attack_from_the_command_line(tiny, tmp_path, capsys):
    """The issue's run: a 2-step `specdec train-heads`, its checkpoint replaced by a pickle that
    creates a file when loaded, then the same command again."""
    out = tmp_path / "heads"
    args = ["train-heads", f"target={tiny['target']}", f"output_dir={out}", "num_heads=2", "seq_len=24",
            "batch_size=2", "steps=2", "warmup_steps=1", "eval_windows=2", "progress=false",
            f"corpus=[{os.path.join(tiny['corpus'], 'm0.py')}]", f"heldout=[{os.path.join(tiny['corpus'], 'm2.py')}]"]
    assert cli_main(args) == 0
    marker = tmp_path / "unpickled"
    checkpoint = out / train.CHECKPOINT_FILE
    torch.save({"step": 1, "history": [], "module": Planted(str(marker))}, checkpoint)
    capsys.readouterr()
    assert cli_main([*args, "steps=4"]) == 2
    err = capsys.readouterr().err
    assert f"specdec train-heads: error: {checkpoint} is a pickled training checkpoint" in err
    assert "Traceback" not in err and not marker.exists()
