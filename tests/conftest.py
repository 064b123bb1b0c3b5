"""Shared fixtures: tiny random causal LMs of several architectures, built in-process."""
from __future__ import annotations

import copy
import logging
import os

import pytest
import torch
import transformers as T

# Tiny models run faster on one thread than on two contending ones (and CI shares its 2 cores).
torch.set_num_threads(1)
# The tests of `compile: true` check its compiled path on this CPU, where a Speculator drops it by
# default (test_compile.py checks that fallback with this unset).
os.environ.setdefault("SPECDEC_COMPILE_ON_CPU", "1")

VOCAB = 96
ARCHITECTURES = ["llama", "gpt2", "gpt_neox", "qwen2", "mistral"]


def tiny_config(arch: str, vocab: int = VOCAB, layers: int = 2, hidden: int = 32, seed_offset: int = 0):
    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        return T.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "gpt2":
        return T.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, **common)
    if arch == "gpt_neox":
        return T.GPTNeoXConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=4, max_position_embeddings=512, **common)
    if arch == "qwen2":
        return T.Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "mistral":
        return T.MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               sliding_window=None, **common)
    raise ValueError(arch)


def tiny_model(arch: str = "llama", seed: int = 0, vocab: int = VOCAB, layers: int = 2, hidden: int = 32,
               sharpen: float = 1.0):
    """A random tiny causal LM in fp32, eval mode. `sharpen` scales the output layer so the
    model's distributions are peaked (realistic acceptance) or flat."""
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(tiny_config(arch, vocab, layers, hidden)).eval()
    if sharpen != 1.0:
        with torch.no_grad():
            head = model.get_output_embeddings()
            if model.config.tie_word_embeddings:
                model.get_input_embeddings().weight.mul_(sharpen)
            else:
                head.weight.mul_(sharpen)
    model.generation_config.pad_token_id = 0
    return model


def char_tokenizer(vocab: int = VOCAB, reverse: bool = False):
    """A character-level fast tokenizer over printable ASCII (specdec.family.tokenizer.char_tokenizer)
    of VOCAB ids by default: ids 0-2 are <pad>, <bos>, <eos>."""
    from specdec.family.tokenizer import char_tokenizer as build
    return build(vocab, reverse)


_REST_STORES: dict = {}


def rest_datastore(texts: tuple[str, ...]) -> str:
    """A REST datastore (strategies/datastore.py) of `texts` under char_tokenizer(), built once per process in a
    folder removed at exit: for suites that build their strategies outside fixtures."""
    if texts not in _REST_STORES:
        import atexit
        import shutil
        import tempfile
        from specdec.strategies.datastore import build, tokenizer_fingerprint
        tokenizer = char_tokenizer()
        folder = tempfile.mkdtemp(prefix="specdec-rest-")
        atexit.register(shutil.rmtree, folder, True)
        build([tokenizer(text)["input_ids"] for text in texts], folder, tokenizer_fingerprint(tokenizer))
        _REST_STORES[texts] = folder
    return _REST_STORES[texts]


def save_target_and_draft(root, arch: str = "llama") -> dict:
    """A tiny `arch` target and a one-layer draft of another seed, saved as HF checkpoints (root/target,
    root/draft) with a character tokenizer: {"target": path, "draft": path}."""
    tokenizer = char_tokenizer()
    folders = {"target": root / "target", "draft": root / "draft"}
    tiny_model(arch, seed=0).save_pretrained(folders["target"])
    tiny_model(arch, seed=1, layers=1).save_pretrained(folders["draft"])
    for folder in folders.values():
        tokenizer.save_pretrained(folder)
    return {role: str(folder) for role, folder in folders.items()}


def save_bench_family(root):
    """The benchmark tests' tiny family in `root`: a 3-layer Llama target and, as its draft, the target
    without its last layer (so drafts are partly accepted), saved as HF checkpoints (root/target,
    root/draft) with a character tokenizer. Returns root."""
    tokenizer = char_tokenizer()
    target = tiny_model("llama", seed=0, layers=3, hidden=32, sharpen=8.0)
    draft = tiny_model("llama", seed=0, layers=3, hidden=32, sharpen=8.0)
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    for name, model in {"target": target, "draft": draft}.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """Reference: Hugging Face generate(do_sample=False), new tokens only."""
    out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, len(prompt_ids):].tolist()


RAGGED_PROMPTS = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)", "ab"]
RAGGED_LENGTHS = [20, 7, 30, 12]


def assert_ragged_batch_greedy_identical(sd) -> None:
    """A ragged batch of four prompts (three rows at a time, lengths apart) through `sd` (a Speculator
    with a tokenizer): each row's text is Hugging Face's greedy text for its prompt, the batch took
    fewer forwards than its rows alone, and drafts were kept."""
    outs = sd.generate(RAGGED_PROMPTS, max_new_tokens=RAGGED_LENGTHS, ignore_eos=True, batch_size=3)
    for prompt, out, n in zip(RAGGED_PROMPTS, outs, RAGGED_LENGTHS):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    assert outs.stats.target_forwards < sum(out.stats.target_forwards for out in outs)
    assert sum(outs.stats.accepted_lengths) > 0


@pytest.fixture(autouse=True)
def _profiles_measured_on_a_quiet_cpu(monkeypatch):
    """Whether a cost profile is stored depends on how long its measurement waited for a core
    (specdec.costmodel.SHARED_CPU); in-process tests see a quiet CPU, so what they store does not
    depend on what else the machine runs. tests/test_profile_robust.py sets the wait itself."""
    monkeypatch.setattr("specdec.costmodel.run_queue_wait_s", lambda: 0.0)


@pytest.fixture(autouse=True)
def _restore_specdec_logger():
    """The "specdec" logger as it was before each test: a test that runs the CLI (which puts a stderr
    handler on it, specdec.log.log_to_stderr) leaves nothing behind for the next."""
    logger = logging.getLogger("specdec")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


@pytest.fixture
def gpu_paths(monkeypatch):
    """The paths a GPU runs where a CPU takes a cheaper one: the host-sync counters (tests/host_reads.py) hold
    a GPU's budget, and on a CPU the token table is read on the host
    (specdec.strategies.token_recycling.reads_on_host), which on a GPU would be a sync."""
    monkeypatch.setattr("specdec.strategies.token_recycling.reads_on_host", lambda table: False)


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param


def noisy_copy(model, noise: float = 0.3, seed: int = 1):
    """The model with Gaussian noise (noise x each tensor's std) added to its weights: a draft
    that agrees with it often but not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=gen).to(p.device) * noise * p.std())
    return draft
