"""The cost profile on disk, when the disk is not on our side: a profile folder that cannot be
written (the profile measured in memory is used, with one warning; `specdec profile` says it
could not store it), a measurement that waited for a busy CPU (used, never stored; a stored one
is measured again), profile files of the wrong shape (re-measured, with a warning naming the
file), and the arguments of `measure_verify_costs` / `Auto(...)` that have no meaning (refused,
named, never clamped). A run whose CPU kernels are held to an older instruction set keeps profiles of
its own."""
from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from conftest import char_tokenizer, tiny_model
from specdec import costmodel
from specdec.costmodel import (HELD_KERNEL_VARIABLES, check_profile, load_or_measure, measure_verify_costs,
                               profile_dir, profile_key, profile_path)
from specdec.errors import ConfigError
from specdec.strategies.auto import Auto

SIZES = (0, 1, 4)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


def unwritable_home(tmp_path) -> str:
    """A SPECDEC_HOME below a regular file: no folder can be made there, root or not (chmod does
    not stop root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return str(blocker / "home")


# ---------------------------------------------------------------------- a folder that cannot be written
def test_unwritable_profile_folder_uses_the_measured_profile_with_one_warning(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", unwritable_home(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = load_or_measure(model, SIZES, context_len=8, repeats=1)
    assert profile.sizes == SIZES and all(s > 0 for s in profile.seconds) and profile.key
    messages = [str(w.message) for w in caught if "profile" in str(w.message)]
    assert len(messages) == 1, messages
    assert profile_dir() in messages[0] and "SPECDEC_HOME to a writable folder" in messages[0]


def test_auto_loads_with_an_unwritable_profile_folder(model, tmp_path, monkeypatch):
    from specdec import Speculator
    from specdec.strategies.prompt_lookup import PromptLookup
    monkeypatch.setenv("SPECDEC_HOME", unwritable_home(tmp_path))
    strategy = Auto(PromptLookup(), None, max_nodes=4, profile_context=8, profile_repeats=1)
    with pytest.warns(UserWarning, match="could not store the cost profile"):
        out = Speculator(model, None, strategy).generate([5, 6, 7, 5, 6], max_new_tokens=4, ignore_eos=True)
    assert len(out.token_ids) == 4 and strategy.costs.sizes == tuple(range(5))


# ---------------------------------------------------------------------- a CPU that other work holds
def waiting_clock(monkeypatch, wait_per_read: float):
    """run_queue_wait_s as if the measuring thread waited wait_per_read seconds for a core between
    two reads: a measurement of a fraction of a second reads it twice, so its wait share is huge."""
    reads = iter(range(10 ** 6))
    monkeypatch.setattr("specdec.costmodel.run_queue_wait_s", lambda: next(reads) * wait_per_read)


def test_a_profile_measured_on_a_busy_cpu_is_used_but_not_stored(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    waiting_clock(monkeypatch, wait_per_read=1000.0)
    with pytest.warns(UserWarning, match="other work held the CPU while measuring") as caught:
        profile = load_or_measure(model, SIZES, context_len=8, repeats=1)
    assert len([w for w in caught if "cost profile" in str(w.message)]) == 1
    assert profile.sizes == SIZES and profile.cpu_wait > 1 and all(s > 0 for s in profile.seconds)
    assert not (tmp_path / "profiles").exists() or not list((tmp_path / "profiles").iterdir())
    waiting_clock(monkeypatch, wait_per_read=0.0)                       # a quiet CPU: stored this time
    quiet = load_or_measure(model, SIZES, context_len=8, repeats=1)
    stored = json.load(open(profile_path(quiet.key)))
    assert stored["cpu_wait"] == 0.0 and check_profile(stored, SIZES) is None


def test_a_stored_profile_that_waited_for_the_cpu_is_measured_again(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    key = profile_key(model, SIZES, 8)
    (tmp_path / "profiles").mkdir()
    busy = {**GOOD, "sizes": list(SIZES), "seconds": [7.0, 8.0, 9.0], "cpu_wait": 0.6}
    (tmp_path / "profiles" / f"verify-{key}.json").write_text(json.dumps(busy))
    with pytest.warns(UserWarning, match="measured while other work held the CPU"):
        profile = load_or_measure(model, SIZES, context_len=8, repeats=1)
    assert profile.seconds != (7.0, 8.0, 9.0) and profile.cpu_wait == 0.0
    assert json.load(open(profile_path(key)))["cpu_wait"] == 0.0        # the quiet one replaced it


def test_profile_command_says_the_cpu_was_busy(target_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    waiting_clock(monkeypatch, wait_per_read=1000.0)
    assert profile_command(target_dir) == 1
    captured = capsys.readouterr()
    assert "waited for a core" in captured.out and "profile written" not in captured.out
    assert "could not store the profile" in captured.err and "other work held the CPU" in captured.err


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profile_target") / "target"
    tiny_model("gpt2", seed=0).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return str(folder)


def profile_command(target_dir):
    from specdec.cli import main
    return main(["profile", "autoregressive", f"target.path={target_dir}", "auto.max_nodes=2",
                 "auto.profile_context=8", "auto.profile_repeats=1", "--max-new-tokens", "2", "--prompt", "ab"])


def test_profile_command_prints_the_path_it_wrote(target_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    assert profile_command(target_dir) == 0
    printed = capsys.readouterr().out
    written = [line for line in printed.splitlines() if line.startswith("profile written to ")]
    assert len(written) == 1
    path = written[0][len("profile written to "):]
    assert path.startswith(str(tmp_path / "home" / "profiles")) and check_profile(json.load(open(path))) is None


def test_profile_command_says_it_could_not_store_the_profile(target_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_HOME", unwritable_home(tmp_path))
    assert profile_command(target_dir) == 1
    captured = capsys.readouterr()
    assert "nodes  seconds" in captured.out and "profile written" not in captured.out
    assert "could not store the profile in " + profile_dir() in captured.err
    assert "SPECDEC_HOME to a writable folder" in captured.err and "Traceback" not in captured.err


# ---------------------------------------------------------------------- profile files of the wrong shape
GOOD = {"sizes": [0, 1, 4], "seconds": [0.01, 0.012, 0.015], "context_len": 8}
BAD_PROFILES = {
    "a list": [0.01, 0.012, 0.015],
    "a string": "fast",
    "no seconds": {"sizes": [0, 1, 4], "context_len": 8},
    "no sizes": {"seconds": [0.01, 0.012, 0.015], "context_len": 8},
    "no context_len": {"sizes": [0, 1, 4], "seconds": [0.01, 0.012, 0.015]},
    "lengths differ": {**GOOD, "seconds": [0.01, 0.012]},
    "sizes descending": {**GOOD, "sizes": [4, 1, 0]},
    "sizes repeated": {**GOOD, "sizes": [0, 1, 1]},
    "other sizes": {**GOOD, "sizes": [0, 2, 4]},
    "one size": {**GOOD, "sizes": [0], "seconds": [0.01]},
    "negative size": {**GOOD, "sizes": [-1, 1, 4]},
    "string sizes": {**GOOD, "sizes": ["0", "1", "4"]},
    "NaN timing": {**GOOD, "seconds": [0.01, math.nan, 0.015]},
    "infinite timing": {**GOOD, "seconds": [0.01, math.inf, 0.015]},
    "cpu_wait not a number": {**GOOD, "cpu_wait": "busy"},
    "negative cpu_wait": {**GOOD, "cpu_wait": -0.1},
    "negative timing": {**GOOD, "seconds": [0.01, -0.012, 0.015]},
    "zero timing": {**GOOD, "seconds": [0.0, 0.012, 0.015]},
    "string timing": {**GOOD, "seconds": ["0.01", "0.012", "0.015"]},
    "boolean timing": {**GOOD, "seconds": [True, True, True]},
    "seconds a string": {**GOOD, "seconds": "0.01"},
    "negative context": {**GOOD, "context_len": -8},
    "string context": {**GOOD, "context_len": "8"},
}


def test_a_good_profile_passes_the_check():
    assert check_profile(GOOD, SIZES) is None and check_profile(GOOD) is None


@pytest.mark.parametrize("name", list(BAD_PROFILES))
def test_bad_profile_file_is_measured_again_with_a_warning_naming_it(name, model, tmp_path, monkeypatch):
    data = BAD_PROFILES[name]
    assert check_profile(data, SIZES) is not None
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    path = profile_path(profile_key(model, SIZES, 8))
    (tmp_path / "profiles").mkdir()
    with open(path, "w") as f:
        f.write(json.dumps(data))             # json writes NaN / Infinity, as a hand edit might
    with pytest.warns(UserWarning) as caught:
        profile = load_or_measure(model, SIZES, context_len=8, repeats=1)
    messages = [str(w.message) for w in caught if "profile" in str(w.message)]
    assert len(messages) == 1 and path in messages[0] and "measuring it again" in messages[0]
    assert profile.sizes == SIZES and all(math.isfinite(s) and s > 0 for s in profile.seconds)
    assert check_profile(json.load(open(path)), SIZES) is None            # the file was measured again


def test_truncated_profile_file_is_measured_again(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    path = profile_path(profile_key(model, SIZES, 8))
    (tmp_path / "profiles").mkdir()
    with open(path, "w") as f:
        f.write(json.dumps(GOOD)[:20])
    with pytest.warns(UserWarning, match="unreadable"):
        profile = load_or_measure(model, SIZES, context_len=8, repeats=1)
    assert profile.sizes == SIZES


# ---------------------------------------------------------------------- arguments without a meaning
@pytest.mark.parametrize("argument, value", [("repeats", 0), ("repeats", -1), ("context_len", 0), ("sizes", ()),
                                             ("sizes", (0, -2))])
def test_measure_verify_costs_refuses_arguments_without_meaning(model, argument, value):
    kwargs = {"sizes": SIZES, "context_len": 8, "repeats": 1, argument: value}
    with pytest.raises(ConfigError, match=f"{argument}="):
        measure_verify_costs(model, **kwargs)


@pytest.mark.parametrize("argument, value, phrase", [
    ("explore_every", 0, ">= 1"), ("explore_every", -3, ">= 1"), ("calibration_prior", 0.0, "> 0"),
    ("calibration_prior", -1.0, "> 0"), ("calibration_prior", math.nan, "finite"), ("profile_repeats", 0, ">= 1"),
    ("profile_context", 0, ">= 1"), ("max_nodes", -1, ">= 0"), ("explore_every", 2.5, "an integer"),
    ("calibration_prior", "4", "a number")])
def test_auto_constructor_refuses_what_the_config_refuses(argument, value, phrase):
    with pytest.raises(ConfigError, match=rf"Auto\({argument}=.*{phrase}"):
        Auto(None, None, profile=False, **{argument: value})


def test_auto_constructor_keeps_valid_values():
    strategy = Auto(None, None, profile=False, explore_every=1, calibration_prior=1e-3, profile_repeats=1, max_nodes=0)
    assert strategy.explore_every == 1 and strategy.profile_repeats == 1 and strategy.max_nodes == 0


# ---------------------------------------------------------------------- kernels held to an older instruction set
def key_parts(model, monkeypatch) -> list:
    """What profile_key hashes for the model (SIZES, context 16), caught on its way to the hash."""
    caught = []
    real_dumps = costmodel.json.dumps
    monkeypatch.setattr(costmodel.json, "dumps", lambda parts, **kw: caught.append(parts) or real_dumps(parts, **kw))
    profile_key(model, SIZES, 16)
    monkeypatch.setattr(costmodel.json, "dumps", real_dumps)
    return caught[-1]


def test_kernels_held_below_the_cpu_key_a_profile_of_their_own(model, monkeypatch):
    """ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA (DNNL_MAX_CPU_ISA) or MKL_ENABLE_INSTRUCTIONS make a forward cost what
    an older CPU's does: a profile measured without them is not read with them, nor one held one way with one held
    another (two values of one variable, or two variables). With none set, or set blank, the key hashes what it
    hashed before holds were keyed (profiles on disk stay valid); a value's case and spaces do not matter."""
    for name in HELD_KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    parts = key_parts(model, monkeypatch)
    assert not any(isinstance(part, list) and part[:1] == ["kernels"] for part in parts), parts
    plain = profile_key(model, SIZES, 16)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "  ")
    assert profile_key(model, SIZES, 16) == plain
    keys = {plain}
    for name, value in (("ATEN_CPU_CAPABILITY", "avx2"), ("ATEN_CPU_CAPABILITY", "default"),
                        ("ONEDNN_MAX_CPU_ISA", "AVX2"), ("DNNL_MAX_CPU_ISA", "AVX2"),
                        ("MKL_ENABLE_INSTRUCTIONS", "AVX2")):
        monkeypatch.setenv(name, value)
        key = profile_key(model, SIZES, 16)
        assert key not in keys, f"{name}={value} left the profile's key as it was"
        monkeypatch.setenv(name, f" {value.swapcase()} ")
        assert profile_key(model, SIZES, 16) == key, f"{name}: case or spaces changed the key"
        keys.add(key)


def test_held_kernels_do_not_key_a_profile_off_the_cpu(model, monkeypatch):
    """The holds act on CPU kernels only: a target on another device keys its profile as before whatever they say."""
    class Elsewhere:              # the model as profile_key reads it, but on a device that is not a CPU
        def __getattr__(self, name):
            return getattr(model, name)
        device = torch.device("meta")
    for name in HELD_KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    before = profile_key(Elsewhere(), SIZES, 16)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert profile_key(Elsewhere(), SIZES, 16) == before
