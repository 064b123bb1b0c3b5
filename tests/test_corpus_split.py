"""A one-file corpus: the trainers hold out the end of that file (and say so in one line) instead of
evaluating on the very text they train on; the default family's corpus, which splits by files,
refuses one file clearly."""
from __future__ import annotations

import json
import os

import pytest

from conftest import char_tokenizer, tiny_model
from specdec.errors import ConfigError
from specdec.family.corpus import split_corpus
from specdec.heads.config import load_train_config
from specdec.heads.data import resolve_files, split_heldout, token_streams, tokenize_files
from specdec.heads.train import train_heads


def one_file_corpus(folder) -> str:
    path = folder / "only.py"
    path.write_text("".join(f"def f{j}(x):\n    return x * {j}\n" for j in range(40)))
    return str(path)


def test_one_file_is_split_by_tokens_and_the_split_is_said(tmp_path):
    tokenizer = char_tokenizer()
    files = resolve_files([one_file_corpus(tmp_path)])
    train_files, heldout_files = split_heldout(files)
    train, heldout, note = token_streams(train_files, heldout_files, tokenizer, tokenizer.eos_token_id, min_tokens=50)
    whole = tokenize_files(files, tokenizer, tokenizer.eos_token_id)
    assert train.numel() + heldout.numel() == whole.numel()
    assert heldout.numel() == max(-(-whole.numel() // 10), 50)                # the last 10%, at least min_tokens
    train_text, heldout_text = tokenizer.decode(train.tolist()), tokenizer.decode(heldout.tolist())
    assert heldout_text not in train_text and train_text + heldout_text == tokenizer.decode(whole.tolist())
    assert note is not None and "only.py" in note and f"last {heldout.numel()} of {whole.numel()} tokens" in note
    assert "\n" not in note


def test_separate_heldout_files_are_kept_whole(tmp_path):
    tokenizer = char_tokenizer()
    (tmp_path / "other.py").write_text("x = 1\n" * 30)
    train_file, heldout_file = one_file_corpus(tmp_path), str(tmp_path / "other.py")
    train, heldout, note = token_streams([train_file], [heldout_file], tokenizer, tokenizer.eos_token_id)
    assert note is None and tokenizer.decode(heldout.tolist()).startswith("x = 1\n")
    assert train.numel() == tokenize_files([train_file], tokenizer, tokenizer.eos_token_id).numel()


def test_training_on_one_file_evaluates_on_its_held_out_end(tmp_path, caplog):
    model_dir = tmp_path / "target"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    corpus = one_file_corpus(tmp_path)
    cfg = load_train_config(None, {"target": str(model_dir), "output_dir": str(tmp_path / "out"), "corpus": [corpus],
                                   "num_heads": 2, "seq_len": 24, "batch_size": 2, "steps": 2, "warmup_steps": 1,
                                   "eval_windows": 2, "progress": False})
    folder = train_heads(cfg)
    notes = [r for r in caplog.records if "held-out text is its training text" in r.getMessage()]
    assert len(notes) == 1 and notes[0].name == "specdec.heads.data" and notes[0].levelname == "WARNING"
    log = json.load(open(os.path.join(folder, "train.json")))
    total = len(open(corpus).read()) + 1                                    # chars + the EOS separator
    assert log["train_tokens"] + log["heldout_tokens"] == total and log["heldout_tokens"] < total // 2


def test_family_corpus_of_one_file_is_refused_clearly(tmp_path):
    one_file_corpus(tmp_path)
    with pytest.raises(ConfigError, match=r"has 1 \.py file\(s\); need at least 2"):
        split_corpus(str(tmp_path), heldout_fraction=0.1, seed=0)
