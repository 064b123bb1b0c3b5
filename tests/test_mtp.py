"""mtp: the target's own MTP modules draft (DeepSeek-V3 / GLM-4.5 layout, model.layers.{L + i}.*).

* loading: the modules read back are the ones saved; a missing, extra or wrongly shaped tensor, a
  checkpoint without MTP weights and one whose shared head belongs to another target are refused,
  the message naming the tensor;
* greedy identity to Hugging Face generate(do_sample=False), chains and trees, one sequence and a
  ragged batch; the exact output law (rejection sampler) with a negative control; the coupled
  sampler's same-seed-same-text.
Parity with Hugging Face's own `generate(use_mtp=True)` is in tests/test_mtp_hf.py.
"""
from __future__ import annotations

import os
import shutil
import sys
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "interop"))
import hf_self_spec  # noqa: E402

from conftest import char_tokenizer, hf_greedy  # noqa: E402
from law import always_accept, generation_law, laws_close, model_dist, sequence_law, token_law, total_variation  # noqa: E402
from specdec import Speculator  # noqa: E402
from specdec.errors import ModelLoadError  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402
from specdec.strategies.autoregressive import Autoregressive  # noqa: E402
from specdec.strategies.mtp import Mtp  # noqa: E402

PROMPT = [5, 17, 33, 9, 41, 60, 70]
N = 20


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny 2-layer GLM-4.5 saved with one MTP module: (its folder, the model loaded from there)."""
    import transformers as T
    folder = str(tmp_path_factory.mktemp("glm_mtp"))
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(hf_self_spec.tiny_glm_config(layers=2)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    added = hf_self_spec.save_with_mtp(model, folder)
    char_tokenizer().save_pretrained(folder)
    return folder, T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), added


def variant(saved, tmp_path, edit):
    """A copy of the saved checkpoint with its tensors edited by edit({name: tensor}), loaded back."""
    import transformers as T
    folder = str(tmp_path / "variant")
    shutil.copytree(saved[0], folder)
    file = os.path.join(folder, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    return folder, T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# ---------------------------------------------------------------------- loading
def test_the_modules_read_are_the_ones_saved(saved):
    _, model, added = saved
    mtp = Mtp.for_target(model).drafter.mtp.layers[0]
    torch.testing.assert_close(mtp.eh_proj.weight, added["model.layers.2.eh_proj.weight"])
    torch.testing.assert_close(mtp.post_norm.weight, added["model.layers.2.shared_head.norm.weight"])
    torch.testing.assert_close(mtp.mtp_block.self_attn.q_proj.weight, added["model.layers.2.self_attn.q_proj.weight"])
    assert Mtp.for_target(model).drafter.mtp.shared_head is model.lm_head        # shared, not copied


# (an edit of a 2-layer target's module tensors, what the refusal says): test_mtp_train.py's module files too
FAULTY_TENSORS = [
    (lambda t: t.pop("model.layers.2.hnorm.weight"), r"lacks tensor 'model\.layers\.2\.hnorm\.weight'"),
    (lambda t: t.pop("model.layers.2.self_attn.q_proj.weight"), r"lacks tensor 'model\.layers\.2\.self_attn\.q_proj\.weight'"),
    (lambda t: t.__setitem__("model.layers.2.eh_proj.weight", torch.zeros(32, 48)),
     r"tensor 'model\.layers\.2\.eh_proj\.weight' .* has shape \(32, 48\), the target's MTP module needs \(32, 64\)"),
    (lambda t: t.__setitem__("model.layers.3.enorm.weight", torch.ones(32)),
     r"holds tensor 'model\.layers\.3\.enorm\.weight' \(1 such\), past the 1 MTP module"),
    (lambda t: t.__setitem__("model.layers.2.extra.weight", torch.ones(3)), r"holds tensor '.*extra\.weight', which no MTP"),
    (lambda t: t.__setitem__("model.layers.2.shared_head.head.weight", torch.randn(96, 32)),
     r"tensor 'model\.layers\.2\.shared_head\.head\.weight' .* is not the target's lm_head .* another target"),
    (lambda t: [t.pop(k) for k in list(t) if k.startswith("model.layers.2.")], r"no tensor 'model\.layers\.2\.\*'"),
]


@pytest.mark.parametrize("edit, phrase", FAULTY_TENSORS)
def test_a_faulty_checkpoint_is_refused_naming_the_tensor(saved, tmp_path, edit, phrase):
    _, model = variant(saved, tmp_path, edit)
    with pytest.raises(ModelLoadError, match=phrase):
        Mtp.for_target(model)


def test_a_target_without_mtp_modules_is_refused():
    from conftest import tiny_model
    with pytest.raises(ModelLoadError, match="announces no MTP modules"):
        Mtp.for_target(tiny_model("llama"))


def test_modules_read_for_another_target_object_are_refused(saved):
    import copy
    strategy = Mtp.for_target(saved[1])
    with pytest.raises(Exception, match="read for another target"):
        Speculator(copy.deepcopy(saved[1]), None, strategy)


def test_the_config_loads_it_from_the_target_path(saved):
    import specdec
    sd = specdec.load("mtp", **{"target.path": saved[0], "device": "cpu", "dtype": "float32", "mtp.depth": 2,
                                "mtp.max_nodes": 2})
    assert sd.strategy.name == "mtp"
    assert sd.generate(PROMPT, max_new_tokens=8, ignore_eos=True).token_ids == \
        hf_greedy(saved[1], PROMPT, 8, eos_token_id=None)


# ---------------------------------------------------------------------- identity
@pytest.mark.parametrize("shape", [dict(depth=1, max_nodes=1), dict(depth=3, max_nodes=3),
                                   dict(depth=3, top_k=2, max_nodes=6)])
def test_greedy_identity(saved, shape):
    model = saved[1]
    out = Speculator(model, None, Mtp.for_target(model, **shape)).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, PROMPT, N, eos_token_id=None)
    assert out.stats.proposed_nodes > 0


def test_ragged_batch(saved):
    model = saved[1]
    prompts = [PROMPT, [8, 9, 10, 11, 12, 13, 8, 9], [60, 70, 60], [3, 4]]
    lengths = [12, 7, 15, 9]
    outs = Speculator(model, None, Mtp.for_target(model, depth=2, top_k=2, max_nodes=4)).generate(
        prompts, max_new_tokens=lengths, ignore_eos=True, batch_size=3)
    for prompt, out, n in zip(prompts, outs, lengths):
        assert out.token_ids == hf_greedy(model, prompt, n, eos_token_id=None)


def test_coupled_reproduces_autoregressive(saved):
    model = saved[1]
    for seed in (0, 1):
        kwargs = dict(max_new_tokens=N, temperature=0.8, seed=seed, ignore_eos=True, sampler="coupled")
        ours = Speculator(model, None, Mtp.for_target(model, top_k=2, max_nodes=4)).generate(PROMPT, **kwargs)
        assert ours.token_ids == Speculator(model, None, Autoregressive()).generate(PROMPT, **kwargs).token_ids


# ---------------------------------------------------------------------- the law
def law_model(folder: str, modules: int):
    """A 2-layer GLM-4.5 over 5 tokens, peaked, saved in `folder` with `modules` MTP modules whose shared head it
    is, loaded back."""
    import transformers as T
    config = hf_self_spec.tiny_glm_config(layers=2, modules=modules)
    config.vocab_size, config.hidden_size, config.head_dim = 5, 16, 4
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    hf_self_spec.save_with_mtp(model, folder)
    return T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def law_saved(tmp_path_factory):
    return law_model(str(tmp_path_factory.mktemp("glm_law")), modules=1)


TOP2 = SamplingParams(1.0, top_k=2)
LAW_PROMPT = [3, 4, 1, 0]


@pytest.mark.parametrize("settings", [dict(sampled_depth=2), dict(sampled_depth=1, sampled_top_k=2, max_nodes=2)])
def test_output_law_is_the_targets(law_saved, settings):
    law = generation_law(Speculator(law_saved, None, Mtp.for_target(law_saved, **settings)), LAW_PROMPT, 3, TOP2)
    tokens = token_law(law)
    expected = sequence_law(model_dist(law_saved, LAW_PROMPT, TOP2), 3)
    assert laws_close(tokens, expected), f"TV {total_variation(tokens, expected):.2e}"
    assert sum(p for (_, accepted), p in law.items() if accepted[0] > 0) > 0.01     # drafts were kept


def test_negative_control_always_accept(law_saved):
    sd = Speculator(law_saved, None, Mtp.for_target(law_saved, sampled_depth=2))
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(sd, LAW_PROMPT, 3, TOP2))
    assert total_variation(tokens, sequence_law(model_dist(law_saved, LAW_PROMPT, TOP2), 3)) > 0.05


def test_auto_runs_mtp_as_its_drafter(saved):
    import specdec
    sd = specdec.load("auto", **{"target.path": saved[0], "device": "cpu", "dtype": "float32", "auto.drafter": "mtp",
                                 "auto.profile": False})
    assert isinstance(sd.strategy.drafter, Mtp)
    assert sd.generate(PROMPT, max_new_tokens=12, ignore_eos=True).token_ids == \
        hf_greedy(saved[1], PROMPT, 12, eos_token_id=None)


# ---------------------------------------------------------------------- several modules
@pytest.fixture(scope="module", params=[2, 3])
def saved_modules(request, tmp_path_factory):
    """A tiny 2-layer GLM-4.5 saved with 2 or 3 MTP modules: (its folder, the model loaded from there)."""
    folder = str(tmp_path_factory.mktemp(f"glm_mtp{request.param}"))
    return folder, hf_self_spec.tiny_with_mtp(folder, "glm-4.5", layers=2, modules=request.param)


# depth past the modules: the last module goes on, fed its own output
@pytest.mark.parametrize("shape", [dict(depth=3, max_nodes=3), dict(depth=5, max_nodes=5),
                                   dict(depth=4, top_k=2, max_nodes=7)])
def test_several_modules_greedy_identity(saved_modules, shape):
    model = saved_modules[1]
    strategy = Mtp.for_target(model, **shape)
    assert strategy.modules == model.config.num_mtp_layers
    out = Speculator(model, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, PROMPT, N, eos_token_id=None)
    assert out.stats.proposed_nodes > 0


def test_several_modules_ragged_batch_and_coupled(saved_modules):
    model = saved_modules[1]
    prompts = [PROMPT, [8, 9, 10, 11, 12, 13, 8, 9], [60, 70, 60], [3, 4]]    # [3, 4]: shorter than 3 modules
    lengths = [12, 7, 15, 9]
    outs = Speculator(model, None, Mtp.for_target(model, depth=4, top_k=2, max_nodes=5)).generate(
        prompts, max_new_tokens=lengths, ignore_eos=True, batch_size=3)
    for prompt, out, n in zip(prompts, outs, lengths):
        assert out.token_ids == hf_greedy(model, prompt, n, eos_token_id=None)
    kwargs = dict(max_new_tokens=N, temperature=0.8, seed=1, ignore_eos=True, sampler="coupled")
    ours = Speculator(model, None, Mtp.for_target(model, top_k=2, max_nodes=4)).generate(PROMPT, **kwargs)
    assert ours.token_ids == Speculator(model, None, Autoregressive()).generate(PROMPT, **kwargs).token_ids


def test_each_depth_is_drafted_by_its_module(saved_modules):
    """Module k drafts depth k: changing module 1's weights changes the second drafted token and never the first."""
    import copy
    model = saved_modules[1]

    def first_chain(strategy):
        drafted = []

        class Recorded(type(strategy)):
            def propose(self, state):
                tree = super().propose(state)
                drafted.append(tree.tokens.tolist())
                return tree

        strategy.__class__ = Recorded
        Speculator(model, None, strategy).generate(PROMPT, max_new_tokens=4, ignore_eos=True)
        return drafted[0]

    plain = Mtp.for_target(model, depth=2, max_nodes=2)
    changed = Mtp.for_target(model, depth=2, max_nodes=2)
    changed.drafter = copy.deepcopy(changed.drafter)
    with torch.no_grad():
        for parameter in changed.drafter.mtp.layers[1].parameters():
            parameter.copy_(torch.randn_like(parameter))
    ours, theirs = first_chain(plain), first_chain(changed)
    assert ours[0] == theirs[0]
    assert ours[1] != theirs[1]


def test_a_missing_second_module_is_refused(saved_modules, tmp_path):
    _, model = variant(saved_modules, tmp_path,
                       lambda t: [t.pop(k) for k in list(t) if k.startswith("model.layers.3.")])
    with pytest.raises(ModelLoadError, match=r"no tensor 'model\.layers\.3\.\*' for MTP module 1"):
        Mtp.for_target(model)


@pytest.fixture(scope="module")
def law_modules(tmp_path_factory):
    return law_model(str(tmp_path_factory.mktemp("glm_law2")), modules=2)


LAW_MODULES_PROMPT = [1, 2, 3]          # a prompt after which module 1's drafts are kept (the premise below)


# (settings, the most drafts some step keeps: 2 in a chain means module 1's draft was kept)
@pytest.mark.parametrize("settings, kept", [(dict(sampled_depth=2), 2),
                                            (dict(sampled_depth=2, sampled_top_k=2, max_nodes=4), 1)])
def test_several_modules_output_law_is_the_targets(law_modules, settings, kept):
    law = generation_law(Speculator(law_modules, None, Mtp.for_target(law_modules, **settings)), LAW_MODULES_PROMPT,
                         3, TOP2)
    tokens = token_law(law)
    expected = sequence_law(model_dist(law_modules, LAW_MODULES_PROMPT, TOP2), 3)
    assert laws_close(tokens, expected), f"TV {total_variation(tokens, expected):.2e}"
    assert sum(p for (_, accepted), p in law.items() if max(accepted) >= kept) > 0.01   # the premise


def test_several_modules_negative_control_always_accept(law_modules):
    sd = Speculator(law_modules, None, Mtp.for_target(law_modules, sampled_depth=2))
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(sd, LAW_MODULES_PROMPT, 3, TOP2))
    assert total_variation(tokens, sequence_law(model_dist(law_modules, LAW_MODULES_PROMPT, TOP2), 3)) > 0.05
