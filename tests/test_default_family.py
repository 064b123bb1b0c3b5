"""The default-family builder on a minimal budget: loadable checkpoints, a cache that is
reused, and interrupted builds that are detected and rebuilt, never loaded."""
from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from zoo import count_windows
import specdec
from specdec.family import config_hash, ensure_family, family_is_built, family_paths, load_family_config
from specdec.family import build as family_module
from specdec.family import lm as family_lm
from specdec.family import store
from specdec.heads import distill
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.loop import lr_at
from specdec.heads.draft_info import read_distill_info

# A family built in a few seconds: a handful of stdlib files, tiny models, a few steps.
MINIMAL_FAMILY = {
    "corpus.max_files": 8, "corpus.tokenizer_chars": 60_000, "corpus.train_chars": 60_000,
    "tokenizer.vocab_size": 320,
    "target.hidden_size": 32, "target.num_layers": 1, "target.num_heads": 2, "target.intermediate_size": 64,
    "target.max_position_embeddings": 512,
    "target.train.steps": 3, "target.train.batch_size": 2, "target.train.seq_len": 32,
    "target.train.warmup_steps": 1, "target.train.eval_windows": 2,
    "draft.train": {"draft_config": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
                    "steps": 3, "batch_size": 2, "seq_len": 32, "warmup_steps": 1, "eval_interval": 1000,
                    "eval_windows": 2, "eval_prompts": 0, "checkpoint_interval": 1000, "progress": False},
    "heads.train": {"num_heads": 2, "num_layers": 1, "seq_len": 32, "batch_size": 2, "steps": 2,
                    "warmup_steps": 1, "eval_interval": 1000, "eval_windows": 2,
                    "checkpoint_interval": 1, "progress": False},
    "eagle.train": {"layout": "eagle1", "ttt_steps": 1, "seq_len": 32, "batch_size": 2, "steps": 2,
                    "max_minutes": None, "warmup_steps": 1, "eval_interval": 1000, "eval_windows": 2,
                    "eval_new_tokens": 8, "eval_depth": 2, "checkpoint_interval": 1, "progress": False},
}


def minimal_config(**extra):
    return load_family_config("default_family", {**MINIMAL_FAMILY, **extra})


def write_minimal_yaml(path) -> str:
    """The minimal family as a YAML file (what --family-config / $SPECDEC_FAMILY_CONFIG take)."""
    OmegaConf.save(minimal_config(), str(path))
    return str(path)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def draft_trainings():
    """The configs `specdec train-draft`'s train_draft was called with while `built` was built."""
    return []


@pytest.fixture(scope="module")
def built(tmp_path_factory, draft_trainings):
    """One minimal family (heads included), built once for the tests that only read it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(tmp_path_factory.mktemp("cache")))
        cfg = minimal_config()
        with pytest.MonkeyPatch.context() as spy:
            real_train_draft = distill.train_draft
            spy.setattr(distill, "train_draft",
                        lambda train_cfg, *a, **k: (draft_trainings.append(OmegaConf.to_container(train_cfg)),
                                                    real_train_draft(train_cfg, *a, **k))[1])
            paths = ensure_family(cfg)
        yield cfg, paths, os.environ["SPECDEC_HOME"]


def test_minimal_build_gives_loadable_checkpoints(built):
    cfg, paths, home = built
    assert paths.folder.startswith(home)
    assert os.path.basename(paths.folder) == f"default-{config_hash(cfg)}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", home)
        assert family_is_built(cfg)
    tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
    assert len(tokenizer) == 320
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == "<|endoftext|>"
    text = "def parse(line):\n    return line.split(',')\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text            # byte-level: lossless
    target = AutoModelForCausalLM.from_pretrained(paths.target)
    draft = AutoModelForCausalLM.from_pretrained(paths.draft)
    assert target.config.hidden_size == 32 and draft.config.hidden_size == 16
    assert AutoTokenizer.from_pretrained(paths.draft).get_vocab() == tokenizer.get_vocab()
    with open(os.path.join(paths.target, "train.json")) as f:
        log = json.load(f)
    assert log["steps"] == 3 and log["heldout_loss"] is not None
    info = read_distill_info(paths.draft)                 # the draft is `specdec train-draft`'s output
    assert info["target"]["path"] == paths.target
    assert info["recipe"]["loss"] == "fkl" and info["recipe"]["data"] == "fixed" and info["recipe"]["steps"] == 3
    assert 0 < info["heldout"]["acceptance_t1"] <= 1
    assert os.path.isfile(os.path.join(paths.heads, "heads.json"))
    assert os.path.isfile(os.path.join(paths.heads, "heads.safetensors"))
    from specdec.heads.eagle_io import load_eagle
    drafter = load_eagle(paths.eagle, target)             # trained for exactly this target
    assert drafter.layout.hidden_size == 32


def test_the_draft_is_distilled_by_train_draft(built, draft_trainings):
    """The family's draft part is `specdec train-draft`'s train_draft, run on the family's target with
    the draft section's recipe, into the part's folder, on the target's own train / held-out files."""
    cfg, paths, _ = built
    assert len(draft_trainings) == 1
    ran = draft_trainings[0]
    assert ran["target"] == paths.target and ran["draft"] is None
    assert ran["draft_config"] == OmegaConf.to_container(cfg.draft.train.draft_config)
    assert (ran["loss"], ran["data"], ran["steps"]) == ("fkl", "fixed", 3)
    assert os.path.dirname(ran["output_dir"]) == paths.folder        # the part's temp folder, renamed to draft/
    with open(os.path.join(paths.draft, os.path.basename(ran["split_file"]))) as f:
        split = json.load(f)
    with open(os.path.join(paths.tokenizer, "split.json")) as f:
        family_split = json.load(f)
    assert split["train"] and set(split["train"]) <= set(family_split["train"])
    assert split["heldout"] and set(split["heldout"]) <= set(family_split["heldout"])
    assert ran["corpus_root"] == family_split["root"]


def test_minimal_family_generates_through_the_public_api(built):
    _, paths, _ = built
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sd = specdec.load("draft_model", **{"target.path": paths.target, "draft.path": paths.draft, "device": "cpu"})
    assert not [w for w in caught if "distilled for the target" in str(w.message)]   # its own target
    out = sd.generate("def parse(", max_new_tokens=10, ignore_eos=True)
    prompt_ids = sd.tokenizer("def parse(")["input_ids"]
    reference = sd.target.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                                   dtype=torch.long), max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert out.token_ids == reference[0, len(prompt_ids):].tolist()
    assert out.stats.new_tokens == 10


def test_load_without_target_path_uses_the_default_family(built, tmp_path, monkeypatch):
    cfg, paths, home = built
    monkeypatch.setenv("SPECDEC_HOME", home)
    monkeypatch.setenv("SPECDEC_FAMILY_CONFIG", write_minimal_yaml(tmp_path / "family.yaml"))
    monkeypatch.setattr(family_module, "_build", _must_not_build)
    sd = specdec.load("draft_model", device="cpu")
    assert sd.config.target.path == paths.target and sd.config.draft.path == paths.draft
    assert sd.config.heads.path == paths.heads and sd.config.eagle.path == paths.eagle
    # a path the user gives is kept
    sd = specdec.load("draft_model", device="cpu", **{"draft.path": paths.target})
    assert sd.config.draft.path == paths.target


def _must_not_build(*args, **kwargs):
    raise AssertionError("a complete family was rebuilt")


def test_complete_family_is_reused(built, monkeypatch):
    cfg, paths, home = built
    monkeypatch.setenv("SPECDEC_HOME", home)
    monkeypatch.setattr(family_module, "_build", _must_not_build)
    assert ensure_family(cfg) == paths


def test_other_config_other_folder(home):
    cfg = minimal_config()
    other = minimal_config(**{"target.train.steps": 4})
    assert config_hash(cfg) != config_hash(other)
    assert family_paths(cfg).folder != family_paths(other).folder


def test_a_family_that_differs_only_in_a_later_part_takes_the_earlier_parts_from_the_cache(built, monkeypatch,
                                                                                          tmp_path):
    """A new drafter setting builds a new family, but its tokenizer, target and draft are the cached
    family's (copied, not trained again); a change to the target rebuilds everything after it."""
    cfg, paths, _ = built
    monkeypatch.setenv("SPECDEC_HOME", os.path.dirname(paths.folder))
    trained = []
    real_step = family_module._Builder.step
    monkeypatch.setattr(family_module._Builder, "step",
                        lambda self, part: (trained.append(part), real_step(self, part))[1])
    new_eagle = minimal_config(**{"eagle.train.steps": 3})
    other = ensure_family(new_eagle)
    assert other.folder != paths.folder
    assert trained == ["eagle"]
    for part in ("target", "draft"):
        first = load_file(os.path.join(paths.folder, part, "model.safetensors"))
        second = load_file(os.path.join(other.folder, part, "model.safetensors"))
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    for part in ("tokenizer", "target", "draft", "heads", "eagle"):
        assert store.part_is_complete(other.folder, part, config_hash(new_eagle))
    specdec.load("eagle", **{"target.path": other.target, "eagle.path": other.eagle, "device": "cpu"})
    trained.clear()
    ensure_family(minimal_config(**{"target.train.steps": 4, "heads.enabled": False, "eagle.enabled": False}))
    assert trained == ["target", "draft"]                  # the tokenizer is shared, the rest is not


def test_a_family_whose_config_file_does_not_match_its_marker_gives_nothing(built, tmp_path):
    cfg, paths, _ = built
    cached = tmp_path / "cache" / os.path.basename(paths.folder)
    shutil.copytree(paths.folder, cached)
    new_folder = str(tmp_path / "cache" / "default-000000000000")
    assert family_module.built_elsewhere(cfg, "target", new_folder) == str(cached / "target")
    text = (cached / "family.yaml").read_text(encoding="utf-8")
    (cached / "family.yaml").write_text(text.replace("seed: 0", "seed: 1"), encoding="utf-8")
    assert family_module.built_elsewhere(cfg, "target", new_folder) is None   # not what it was built from


def test_same_seed_same_weights(home, tmp_path, monkeypatch):
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    first = ensure_family(cfg)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "second"))
    second = ensure_family(cfg)
    assert first.folder != second.folder
    for part in ("target", "draft"):
        a = load_file(os.path.join(first.folder, part, "model.safetensors"))
        b = load_file(os.path.join(second.folder, part, "model.safetensors"))
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_part_folder_without_complete_marker_is_rebuilt(home):
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    paths = family_paths(cfg)
    os.makedirs(paths.target)                     # what a crash mid-copy could leave behind
    with open(os.path.join(paths.target, "config.json"), "w") as f:
        f.write("{ half written")
    assert not family_is_built(cfg)
    ensure_family(cfg)
    assert family_is_built(cfg)
    AutoModelForCausalLM.from_pretrained(paths.target)           # the stale part was replaced
    assert store.part_is_complete(paths.folder, "target", config_hash(cfg))


def test_interrupted_build_is_not_complete_and_resumes(home, monkeypatch):
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    paths = family_paths(cfg)
    built_parts = []
    real_step = family_module._Builder.step

    def step_then_crash_on_draft(self, part):
        built_parts.append(part)
        if part != "draft":
            return real_step(self, part)

        def crash(out):
            with open(os.path.join(out, "config.json"), "w") as f:
                f.write("{}")                        # a partly written part...
            raise KeyboardInterrupt("simulated interruption")   # ...then the user hits Ctrl-C
        return crash

    monkeypatch.setattr(family_module._Builder, "step", step_then_crash_on_draft)
    with pytest.raises(KeyboardInterrupt):
        ensure_family(cfg)
    assert built_parts == ["tokenizer", "target", "draft"]
    assert not family_is_built(cfg)
    assert not os.path.exists(os.path.join(paths.folder, store.COMPLETE))
    assert not os.path.exists(paths.draft)                  # the half-built part never took its name
    assert [n for n in os.listdir(paths.folder) if ".building-" in n] == []

    monkeypatch.setattr(family_module._Builder, "step",
                        lambda self, part: (built_parts.append(part), real_step(self, part))[1])
    ensure_family(cfg)
    assert family_is_built(cfg)
    assert built_parts == ["tokenizer", "target", "draft", "draft"]    # finished parts are kept, the rest rebuilt
    AutoModelForCausalLM.from_pretrained(paths.draft)


def test_the_target_is_pretrained_in_the_one_loop_and_a_build_interrupted_there_goes_on_from_its_checkpoint(
        built, home, monkeypatch):
    """The target part trains in the one training loop (heads/loop.py, which draws every training batch):
    Ctrl-C in its pretraining leaves the loop's checkpoint in the family folder, the rerun draws only
    the batches of the steps left, and the target ends as the uninterrupted build's (`built`, whose
    target part has the same config) ends, bit for bit."""
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    _, straight, _ = built
    paths = family_paths(cfg)
    work = store.work_folder(paths.folder, "target")
    with monkeypatch.context() as mp:
        count_windows(mp, interrupt_at=3)                      # Ctrl-C inside step 3 of 3: steps 1-2 are finished
        with pytest.raises(KeyboardInterrupt):
            ensure_family(cfg)
    assert not family_is_built(cfg) and not os.path.exists(paths.target)
    assert read_checkpoint(os.path.join(work, family_lm.RUN.checkpoint))["step"] == 2

    with monkeypatch.context() as mp:
        drawn = count_windows(mp)
        ensure_family(cfg)
    assert len(drawn) == 1 + cfg.draft.train.steps             # the target's last step, then the draft's steps
    assert not os.path.exists(work)                            # a built part leaves no run behind
    resumed = load_file(os.path.join(paths.target, "model.safetensors"))
    uninterrupted = load_file(os.path.join(straight.target, "model.safetensors"))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
    records = []
    for folder in (paths.target, straight.target):
        with open(os.path.join(folder, family_lm.RUN.log)) as f:
            run = json.load(f)
        with open(os.path.join(folder, "train.json")) as f:
            records.append(json.load(f))
        assert len(run["losses"]) == 3 and [h["step"] for h in run["history"]] == [0, 3]
        assert records[-1]["first_loss"] == run["losses"][0] and records[-1]["last_loss"] == run["losses"][-1]
        assert records[-1]["heldout_loss"] == run["history"][-1]["heldout_loss"]
    assert ({k: v for k, v in records[0].items() if k != "minutes"} ==
            {k: v for k, v in records[1].items() if k != "minutes"})


def test_the_loop_pretrains_the_target_as_the_builders_own_loop_did(home, monkeypatch):
    """The target's pretraining in the one loop gives, bit for bit, the weights of the builder's own loop
    before it: AdamW with betas (0.9, 0.95) and weight decay on the matrices only, the warmup-cosine
    schedule, clipping, and windows of seq_len + 1 tokens whose starts stop one short of the stream's last
    (builder_windows), drawn from a generator seeded with the family's seed. So the default family's
    target, and what was measured on it, did not change when its training moved into the loop."""
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    streams = []                                               # the loop's training stream, as the draws see it
    real_windows = family_lm.builder_windows
    monkeypatch.setattr(family_lm, "builder_windows",
                        lambda stream, *rest: (streams.append(stream), real_windows(stream, *rest))[1])
    paths = ensure_family(cfg)
    stream, recipe = streams[0], cfg.target.train                # [T]

    tokenizer = AutoTokenizer.from_pretrained(paths.target)
    model = family_lm.new_llama(cfg.target, len(tokenizer), tokenizer.eos_token_id, cfg.seed)
    optimizer = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() >= 2],
                                    "weight_decay": recipe.weight_decay},
                                   {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=recipe.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(cfg.seed)
    model.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        starts = torch.randint(0, len(stream) - recipe.seq_len - 1, (recipe.batch_size,), generator=generator)
        windows = torch.stack([stream[s: s + recipe.seq_len + 1] for s in starts.tolist()])   # [b, seq_len + 1]
        loss = family_lm.window_loss(model, windows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
    built_weights, classic = load_file(os.path.join(paths.target, "model.safetensors")), model.state_dict()
    assert len(streams) == recipe.steps
    assert all(torch.equal(built_weights[name], classic[name]) for name in built_weights)
    fresh = family_lm.new_llama(cfg.target, len(tokenizer), tokenizer.eos_token_id, cfg.seed).state_dict()
    assert any(not torch.equal(classic[name], fresh[name]) for name in built_weights)     # it did train


def test_stale_complete_marker_from_another_config_is_not_trusted(home):
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    paths = family_paths(cfg)
    os.makedirs(paths.folder)
    store.mark_complete(paths.folder, "0123456789ab")            # a marker with another hash
    assert not family_is_built(cfg)


def test_bad_family_config_names_the_problem():
    with pytest.raises(specdec.ConfigError, match="hidden_size"):
        minimal_config(**{"target.num_heads": 3})
    with pytest.raises(specdec.ConfigError, match="unknown config key"):
        load_family_config("default_family", {"target.layers": 2})
    with pytest.raises(specdec.ConfigError, match=r"draft\.train\.draft_config\.hidden_size"):
        minimal_config(**{"draft.train.draft_config.num_heads": 3})
    with pytest.raises(specdec.ConfigError, match=r"draft\.train\.draft must be null"):
        minimal_config(**{"draft.train.draft": "/some/other/draft"})
    with pytest.raises(specdec.ConfigError, match="loss"):
        minimal_config(**{"draft.train.loss": "kl"})


def test_load_without_target_says_it_builds_the_default_family(monkeypatch, capsys, caplog):
    """specdec.load() with no target.path never trains silently: it says what it builds and how to
    use one's own model instead - a warning of the specdec logger (shown on stderr when logging is not
    configured), never a print."""
    from omegaconf import OmegaConf
    from specdec.family import defaults
    from specdec.family.build import FamilyPaths
    paths = FamilyPaths(folder="/nowhere", tokenizer="/nowhere/tokenizer", target="/nowhere/target",
                        draft="/nowhere/draft", heads=None)
    monkeypatch.setattr(defaults, "family_is_built", lambda cfg: False)
    monkeypatch.setattr(defaults, "ensure_family", lambda cfg: paths)
    cfg = OmegaConf.create({"target": {"path": None}, "draft": {"path": None}, "heads": {"path": None},
                            "eagle": {"path": None}})
    defaults.apply_default_paths(cfg)
    assert cfg.target.path == "/nowhere/target" and cfg.draft.path == "/nowhere/draft"
    [record] = [r for r in caplog.records if r.name.startswith("specdec")]
    assert record.name == "specdec.family.defaults" and record.levelname == "WARNING"
    message = record.getMessage()
    assert "no target.path given" in message and "building it now" in message and "target.path=" in message
    assert capsys.readouterr() == ("", "")


def _stub_parts(monkeypatch):
    """Parts built in no time (empty folders): the build's own messages without its training."""
    monkeypatch.setattr(family_module._Builder, "step", lambda self, part: (lambda out: None))


def test_building_logs_through_the_logger_and_prints_nothing(home, monkeypatch, capsys, caplog):
    import logging
    _stub_parts(monkeypatch)
    caplog.set_level(logging.INFO, logger="specdec")
    cfg = minimal_config(**{"heads.enabled": False, "eagle.enabled": False})
    ensure_family(cfg)
    messages = [r.getMessage() for r in caplog.records if r.name == "specdec.family.build"]
    assert messages[0].startswith("specdec: building the default model family (tokenizer, target, draft)")
    assert messages[1:4] == ["tokenizer ...", "target ...", "draft ..."]
    assert messages[-1].startswith("specdec: default model family ready in")
    assert capsys.readouterr() == ("", "")


def test_the_cli_shows_the_build_progress_on_stderr(home, tmp_path, monkeypatch, capsys):
    """`specdec generate` without target.path: the warning and the build's progress (INFO) on stderr,
    as plain lines, through the handler the CLI puts on the specdec logger; nothing on stdout."""
    from specdec.cli import main as cli_main
    _stub_parts(monkeypatch)
    monkeypatch.setenv("SPECDEC_FAMILY_CONFIG", write_minimal_yaml(tmp_path / "family.yaml"))
    code = cli_main(["generate", "autoregressive", "device=cpu", "--prompt", "x"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""               # the stub parts hold no model: loading the target fails
    lines = err.splitlines()
    assert lines[0].startswith("specdec: no target.path given, so specdec uses its small embedded default model")
    assert lines[1].startswith("specdec: building the default model family (")
    assert "tokenizer ..." in lines and "target ..." in lines
    assert any(line.startswith("specdec: default model family ready in") for line in lines)
    assert lines[-1].startswith("specdec generate: error:")
