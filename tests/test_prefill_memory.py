"""Memory on long prompts: the verifier asks the target for the hidden states
of the layers a strategy reads and no others, computes the prefill's lm_head on its last row only,
and feeds a long prompt in chunks of `prefill_chunk` tokens - without changing a single output.

The memory test watches what the target hands the verifier (a forward hook on the target records
every tensor of every output): a 24-layer target with a 4k-token prompt under eagle must never
return a tuple of all 25 hidden states, nor a [prompt, V] block of logits."""
from __future__ import annotations

import pytest
import torch
import transformers as T

from conftest import hf_greedy, noisy_copy
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.tree import CandidateTree
from specdec.verifier import Verifier
from test_compat import SLIDING_KINDS, build, long_prompt, sliding_model

VOCAB = 96
LAYERS = 24
EAGLE3_LAYERS = (2, LAYERS // 2, LAYERS - 3)


def many_layer_target(context: int = 4608):
    """24 thin Llama layers (hidden 16) with room for a 4k-token prompt."""
    config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=LAYERS,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return build(config, sharpen=1.0)


class OutputWatch:
    """A forward hook on the target that records, for every forward, the shape of each tensor it
    returns and how many hidden states its `hidden_states` tuple holds (entries not None)."""

    def __init__(self, model):
        self.forwards: list[dict] = []
        self.handle = model.register_forward_hook(self._record)

    def _record(self, module, args, output):
        hidden = output.get("hidden_states")
        tensors = [v for v in output.values() if isinstance(v, torch.Tensor)]
        tensors += [h for h in (hidden or ()) if isinstance(h, torch.Tensor)]
        self.forwards.append(dict(hidden_states=0 if hidden is None else sum(h is not None for h in hidden),
                                  logits=tuple(output["logits"].shape),
                                  largest=max(t.numel() for t in tensors)))

    def close(self):
        self.handle.remove()


@pytest.mark.parametrize("layers", [(-1,), EAGLE3_LAYERS], ids=["eagle1", "eagle3"])
def test_long_prompt_builds_no_all_layers_tuple(layers):
    target = many_layer_target()
    hidden = target.config.hidden_size
    prompt = torch.randint(3, VOCAB, (4096,), generator=torch.Generator().manual_seed(0)).tolist()
    sd = Speculator(target, None, Eagle(random_drafter(target, layers), max_nodes=4, top_k=2, depth=2))
    chunk = sd.verifier.prefill_chunk
    assert chunk < len(prompt), "precondition: the prompt is fed in more than one chunk"
    watch = OutputWatch(target)
    try:
        out = sd.generate(prompt, max_new_tokens=4, ignore_eos=True)
    finally:
        watch.close()
    assert len(out.token_ids) == 4
    assert watch.forwards[0]["logits"] == (1, 1, VOCAB)    # a prefill chunk: its last row's logits alone
    assert len(watch.forwards) >= 2 + 1            # two prefill chunks (4095 tokens), then verify steps
    for forward in watch.forwards:
        assert forward["hidden_states"] == len(layers), forward       # never 25 (every layer and the embeddings)
        # the largest tensor: one chunk's features of one layer, or a verify step's logits
        assert forward["largest"] <= max(chunk * hidden, 64 * VOCAB), forward


def test_selected_features_equal_the_full_tuples():
    """What the verifier returns for eagle3's layers equals those layers of the all-layers tuple,
    for the prefill and a tree forward."""
    target = many_layer_target(context=256)
    prompt = long_prompt(40)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        full = target(input_ids=ids, output_hidden_states=True).hidden_states      # 25 x [1, P, H]
    expected = torch.cat([full[i][0] for i in EAGLE3_LAYERS], dim=-1)               # [P, 3H]
    verifier = Verifier(target, prefill_chunk=7)
    prefill = verifier.prefill(prompt[:-5], EAGLE3_LAYERS)
    torch.testing.assert_close(prefill, expected[:-5], rtol=1e-5, atol=1e-5)
    chain = CandidateTree.chain(torch.tensor(prompt[-4:]))
    out = verifier.forward(prompt[-5], chain, EAGLE3_LAYERS)
    torch.testing.assert_close(out.hidden, expected[-5:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", ["grown", "static"])
@pytest.mark.parametrize("kind", SLIDING_KINDS)
def test_chunked_prefill_features_and_logits(kind, cache):
    """A prompt fed 5 tokens at a time leaves the cache a whole-prompt prefill leaves: the same
    features, and a tree forward on top of it gives the same logits (windows of 16 < the prompt)."""
    target = sliding_model(kind)
    prompt = long_prompt()
    layers = (1, -1)
    tree = CandidateTree(torch.tensor([11, 12, 13, 14]), (-1, 0, -1, 2))
    results = []
    for chunk in (5, 4096):
        verifier = Verifier(target, compile=cache == "static", prefill_chunk=chunk)
        if cache == "static":
            verifier.static.buckets = ()        # the static cache and masks, run eagerly (no compile time)
        hidden = verifier.prefill(prompt[:-1], layers)
        out = verifier.forward(prompt[-1], tree, layers)
        results.append((hidden, out.logits, out.hidden))
    (hidden, logits, tree_hidden), (whole_hidden, whole_logits, whole_tree_hidden) = results
    assert hidden.shape == (len(prompt) - 1, 2 * target.config.hidden_size)
    torch.testing.assert_close(hidden, whole_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, whole_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree_hidden, whole_tree_hidden, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", ["grown", "static"])
@pytest.mark.parametrize("strategy", ["tree", "eagle"])
@pytest.mark.parametrize("kind", SLIDING_KINDS)
def test_chunked_prefill_greedy_identity(kind, strategy, cache):
    """prefill_chunk 5 on a 64-token prompt with windows of 16: the output is Hugging Face's."""
    target = sliding_model(kind)
    prompt, new = long_prompt(), 16
    if strategy == "tree":
        drafter = DraftModel(noisy_copy(target, noise=0.15), branching=[3, 2, 1])
    else:
        drafter = Eagle(random_drafter(target, (1, -1)), max_nodes=4, top_k=2, depth=2)
    sd = Speculator(target, None, drafter, compile=cache == "static")
    sd.verifier.prefill_chunk = 5
    if cache == "static":
        sd.verifier.static.buckets = ()
    out = sd.generate(prompt, max_new_tokens=new, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, prompt, new, eos_token_id=None)


def test_prefill_chunk_is_a_config_setting():
    from specdec.config import load_spec_config
    from specdec.errors import ConfigError
    assert load_spec_config("autoregressive", {"prefill_chunk": 512}).prefill_chunk == 512
    with pytest.raises(ConfigError, match="prefill_chunk"):
        load_spec_config("autoregressive", {"prefill_chunk": 0})


def test_static_prefill_keeps_the_last_rows_logits():
    """compile: true's prefill (the static cache, eager for chunks beyond the largest bucket) asks
    for the lm_head of each chunk's last row only."""
    target = sliding_model("mistral")
    verifier = Verifier(target, compile=True, prefill_chunk=16)
    verifier.static.buckets = ()
    watch = OutputWatch(target)
    try:
        verifier.prefill(long_prompt(), (-1,))
    finally:
        watch.close()
    assert [f["logits"] for f in watch.forwards] == [(1, 1, VOCAB)] * 4     # 64 tokens, 16 per chunk


def test_drafters_catch_up_in_chunks(monkeypatch):
    """The drafters feed a long prompt CATCH_UP_CHUNK rows per forward (here 5) and end where one
    forward over the whole prompt ends: the same logits for the pending token's children."""
    import specdec.strategies.draft_model as draft_module
    import specdec.strategies.eagle as eagle_module
    from eagle_helpers import state_for
    target = sliding_model("mistral")
    prompt = long_prompt()
    drafter_forwards, draft_forwards = [], []

    def roots():
        eagle = Eagle(random_drafter(target, (1, -1)), max_nodes=4, top_k=2, depth=2)
        eagle.bind(target, None)
        handle = eagle.drafter.register_forward_hook(lambda *_: drafter_forwards.append(1))
        eagle.reset(state_for(prompt, Verifier(target).prefill(prompt[:-1], eagle.feature_layers)))
        eagle_logits = eagle.catch_up(prompt)[1]
        handle.remove()
        draft = DraftModel(noisy_copy(target, noise=0.15), num_tokens=2)
        draft.bind(target, None)
        draft.reset(state_for(prompt, None))
        handle = draft.draft.register_forward_hook(lambda *_: draft_forwards.append(1))
        draft_logits = draft._catch_up(prompt)
        handle.remove()
        return eagle_logits, draft_logits

    whole = roots()
    assert len(drafter_forwards) == len(draft_forwards) == 1
    for module in (eagle_module, draft_module):
        monkeypatch.setattr(module, "CATCH_UP_CHUNK", 5)
    chunked = roots()
    assert len(drafter_forwards) == 1 + 13                    # eagle: 63 prompt features, 5 per forward
    assert len(draft_forwards) == 1 + 13                      # draft model: 64 tokens (the pending one too)
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked[1], whole[1], rtol=1e-5, atol=1e-5)
