"""The standard EAGLE-3 drafter: the module EAGLE-3 checkpoints are exchanged in (the EAGLE
repository, `speculators` for vLLM, SGLang), with a reduced draft vocabulary.

Row t reads the target's hidden states at position t from three layers side by side ([.., 3 Ht],
`feature_layers` as indices into Hugging Face's `hidden_states`: the input of decoder layer i),
projected by `fc` to the drafter's width H (g_t), and the embedding of token t + 1 (e_t). Its one
decoder layer attends with queries, keys and values read from [input_layernorm(e_t);
hidden_norm(g_t)] (2H wide), adds the attention to g_t (or to hidden_norm(g_t) with
`norm_before_residual`), then a SwiGLU MLP, pre-norm, as a Llama layer. Its output x_t stands for
the feature at t + 1: deeper draft steps feed x_t back as g (`norm_output`: norm(x_t) instead),
and `lm_head(norm(x_t))` gives logits over the draft vocabulary: N target tokens, draft id i being
target id i + d2t[i] (`t2d` marks the target ids that have one). Scattered into the target
vocabulary with -inf elsewhere, they make a distribution with zero mass off the draft vocabulary,
so sampled trees carry exact draft distributions and the target's law is kept by the verifier.

Parameter names are the `speculators` ones (`fc`, `layers.0.*`, `norm`, `lm_head`, `d2t`, `t2d`,
optional `embed_tokens`): a speculators checkpoint loads with load_state_dict as is; the EAGLE
repository and SGLang name layer 0 `midlayer` (specdec.heads.eagle_formats renames).
The call interface is EagleDrafter's (specdec.heads.eagle), so the eagle strategy, its training
and its evaluation serve both.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from specdec.cache import BufferedLayer
from specdec.tree import host_to_device

from .eagle import attend


@dataclass(frozen=True)
class Eagle3Layout:
    hidden_size: int                     # Ht: the target's hidden size (each captured layer's width)
    vocab_size: int                      # V: the target's vocabulary (the width logits are scattered into)
    draft_vocab_size: int                # N: the drafter's lm_head rows
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    feature_layers: tuple[int, ...]      # hidden_states indices read, in the order fc reads them
    draft_hidden_size: int | None = None   # H: the drafter's width (None = Ht)
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)   # Hugging Face rope parameters beyond theta
    max_position_embeddings: int = 2048
    norm_eps: float = 1e-6
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_residual: bool = False   # the residual is hidden_norm(g) instead of g
    norm_before_fc: bool = False         # one RMSNorm over the concatenated features before fc
    fc_norm: bool = False                # one RMSNorm per captured layer before fc
    norm_output: bool = False            # feed norm(x) back between steps (EAGLE 3.1) instead of x
    own_embedding: bool = False          # the drafter carries embed_tokens (else it reads the target's)
    style: str = "eagle3"

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if self.style != "eagle3":
            raise ValueError(f"not an EAGLE-3 layout: style={self.style!r}")
        if not self.feature_layers:
            raise ValueError("feature_layers must name at least one target layer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..vocab_size {self.vocab_size}")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm exclude each other")

    fused = True
    name = "eagle3"

    @property
    def width(self) -> int:
        """H: the drafter's own hidden size."""
        return self.draft_hidden_size or self.hidden_size

    @property
    def feature_size(self) -> int:
        return len(self.feature_layers) * self.hidden_size

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    def as_dict(self) -> dict:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return d

    def layer_config(self) -> LlamaConfig:
        """The Llama config of the drafter's decoder layer (what speculators calls transformer_layer_config)."""
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        return LlamaConfig(hidden_size=self.width, intermediate_size=self.intermediate_size,
                           num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                           head_dim=self.head_dim, num_hidden_layers=1, vocab_size=self.vocab_size,
                           rms_norm_eps=self.norm_eps, max_position_embeddings=self.max_position_embeddings,
                           attention_bias=self.attention_bias, mlp_bias=self.mlp_bias, rope_parameters=rope)


class Eagle3Attention(nn.Module):
    """Self-attention whose q / k / v read 2H inputs; grouped-query (num_kv_heads <= num_heads)."""

    def __init__(self, layout: Eagle3Layout):
        super().__init__()
        h, d, bias = layout.width, layout.head_dim, layout.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = layout.num_heads, layout.num_kv_heads, d
        self.q_proj = nn.Linear(2 * h, layout.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(2 * h, layout.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(2 * h, layout.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(layout.num_heads * d, h, bias=bias)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:     # [B, n, heads * d] -> [B, heads, n, d]
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, rotary, past_k=None, past_v=None, visible=None, cache: BufferedLayer | None = None,
                start: int = 0):
        """x [B, n, 2H]; rotary (cos, sin) [B, n, d]; past / visible / cache / start as DrafterBlock's.
        Returns (out [B, n, H], k [B, kv_heads, n, d], v [B, kv_heads, n, d])."""
        q = self._split(self.q_proj(x), self.num_heads)
        k = self._split(self.k_proj(x), self.num_kv_heads)
        v = self._split(self.v_proj(x), self.num_kv_heads)
        q, k = apply_rotary_pos_emb(q, k, *rotary)
        attn = attend(q, k, v, past_k, past_v, visible, cache, start,
                      enable_gqa=self.num_kv_heads != self.num_heads)                      # [B, heads, n, d]
        return self.o_proj(attn.transpose(1, 2).flatten(2)), k, v


class Eagle3MLP(nn.Module):
    def __init__(self, layout: Eagle3Layout):
        super().__init__()
        h, inner, bias = layout.width, layout.intermediate_size, layout.mlp_bias
        self.gate_proj = nn.Linear(h, inner, bias=bias)
        self.up_proj = nn.Linear(h, inner, bias=bias)
        self.down_proj = nn.Linear(inner, h, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """Decoder layer 0 of an EAGLE-3 drafter (speculators' names)."""

    def __init__(self, layout: Eagle3Layout):
        super().__init__()
        h = layout.width
        self.norm_before_residual = layout.norm_before_residual
        self.input_layernorm = nn.RMSNorm(h, eps=layout.norm_eps)
        self.hidden_norm = nn.RMSNorm(h, eps=layout.norm_eps)
        self.self_attn = Eagle3Attention(layout)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=layout.norm_eps)
        self.mlp = Eagle3MLP(layout)

    def forward(self, embed, g, rotary, past_k=None, past_v=None, visible=None, cache=None, start: int = 0):
        """embed, g [B, n, H] -> (x [B, n, H], k, v)."""
        hidden = self.hidden_norm(g)
        residual = hidden if self.norm_before_residual else g
        attn, k, v = self.self_attn(torch.cat([self.input_layernorm(embed), hidden], dim=-1), rotary,
                                    past_k, past_v, visible, cache, start)
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Eagle3Drafter(nn.Module):
    """forward / input_features / logits as EagleDrafter's; `out` is what the next depth reads as g."""

    def __init__(self, layout: Eagle3Layout):
        super().__init__()
        self.layout = layout
        h, features = layout.width, len(layout.feature_layers)
        if layout.own_embedding:
            self.embed_tokens = nn.Embedding(layout.vocab_size, h)
        if layout.norm_before_fc:
            self.input_norm = nn.RMSNorm(layout.feature_size, eps=layout.norm_eps)
        if layout.fc_norm:
            self.fc_norm = nn.ModuleList(nn.RMSNorm(layout.hidden_size, eps=layout.norm_eps) for _ in range(features))
        self.fc = nn.Linear(layout.feature_size, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(layout)])
        self.norm = nn.RMSNorm(h, eps=layout.norm_eps)
        self.lm_head = nn.Linear(h, layout.draft_vocab_size, bias=False)
        # draft id i is target id i + d2t[i]; t2d[t]: target id t has a draft id
        self.register_buffer("d2t", torch.zeros(layout.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(layout.vocab_size, dtype=torch.bool)
                             if not layout.reduced_vocab else torch.zeros(layout.vocab_size, dtype=torch.bool))
        # outside the module tree: .to(bfloat16) must not round its fp32 inverse frequencies
        self._rotary = [LlamaRotaryEmbedding(layout.layer_config())]
        self._shared_embedding: list[nn.Module] = []    # the target's input embedding, outside state_dict()

    # ------------------------------------------------------------------ vocabulary
    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """[N] the target ids of the draft vocabulary (None: the whole target vocabulary, in order)."""
        if not self.layout.reduced_vocab:
            return None
        return torch.arange(self.layout.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Make target_ids [N] (distinct, ascending or not) the draft vocabulary, draft id i <-> target_ids[i]."""
        target_ids = host_to_device(target_ids, self.d2t.device)
        if target_ids.shape != self.d2t.shape or len(set(target_ids.tolist())) != len(target_ids):
            raise ValueError(f"a draft vocabulary needs {self.layout.draft_vocab_size} distinct target ids")
        with torch.no_grad():
            self.d2t.copy_(target_ids - torch.arange(len(target_ids), device=target_ids.device))
            self.t2d.zero_()
            self.t2d[target_ids] = True

    def check_vocab(self) -> None:
        """ValueError unless d2t maps into the target vocabulary, one-to-one, onto the ids t2d marks."""
        ids = torch.arange(self.layout.draft_vocab_size, device=self.d2t.device) + self.d2t
        if ids.min() < 0 or ids.max() >= self.layout.vocab_size:
            raise ValueError(f"d2t maps draft ids outside the target vocabulary 0..{self.layout.vocab_size - 1}")
        if len(torch.unique(ids)) != len(ids):
            raise ValueError("d2t maps two draft ids to one target id")
        marked = torch.zeros_like(self.t2d)
        marked[ids] = True
        if not torch.equal(marked, self.t2d.bool()):
            raise ValueError("t2d does not mark exactly the target ids d2t maps to")

    # ------------------------------------------------------------------ the target's modules
    def attach_lm_head(self, lm_head: nn.Module) -> None:
        """EAGLE-3 has its own lm_head: the target's is not used."""

    def attach_embedding(self, embedding: nn.Module) -> None:
        """Read the target's (frozen) input embedding (not saved), unless the drafter carries its own."""
        self._shared_embedding[:] = [embedding]

    uses_target_lm_head = False

    def embedding(self) -> nn.Module:
        if self.layout.own_embedding:
            return self.embed_tokens
        if not self._shared_embedding:
            raise RuntimeError("the drafter uses the target's input embedding: call attach_embedding with it "
                               "first (load_eagle and the eagle strategy do)")
        return self._shared_embedding[0]

    # ------------------------------------------------------------------ the call interface
    def input_features(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., F] (the captured layers side by side) -> g [..., H]."""
        if self.layout.norm_before_fc:
            features = self.input_norm(features)
        elif self.layout.fc_norm:
            parts = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(features)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] outputs -> [..., N] logits over the draft vocabulary."""
        return self.lm_head(out if self.layout.norm_output else self.norm(out))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] outputs -> [..., V] logits over the target vocabulary (-inf off the draft vocabulary)."""
        draft = self.draft_logits(out)
        if not self.layout.reduced_vocab:
            return draft
        full = draft.new_full((*draft.shape[:-1], self.layout.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab, draft)

    def forward(self, g, tokens, positions, past_k=None, past_v=None, visible=None, with_logits: bool = True,
                cache: BufferedLayer | None = None, start: int = 0):
        """As EagleDrafter.forward: g [B, n, H], tokens [B, n], positions [B, n] -> (out [B, n, H],
        logits [B, n, V] or None, k, v)."""
        embed = self.embedding()(tokens).to(g.dtype)                          # [B, n, H]
        rotary_embedding = self._rotary[0]
        if rotary_embedding.inv_freq.device != g.device:
            rotary_embedding.to(g.device)
        rotary = rotary_embedding(g, positions)                               # cos, sin [B, n, d]
        x, k, v = self.layers[0](embed, g, rotary, past_k, past_v, visible, cache, start)
        out = self.norm(x) if self.layout.norm_output else x
        return out, (self.logits(out) if with_logits else None), k, v


def eagle3_layout_for_target(target, feature_layers, draft_vocab_size: int | None = None,
                             intermediate_size: int | None = None, **flags) -> Eagle3Layout:
    """An EAGLE-3 layout shaped like one layer of `target` (draft_vocab_size None: the whole vocabulary)."""
    config = target.config
    hidden = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", None) or max(1, hidden // 64))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    inner = int(intermediate_size or getattr(config, "intermediate_size", None) or 4 * hidden)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(rope.pop("rope_theta", None) or getattr(config, "rope_theta", None) or 10000.0)
    scaling = {k: v for k, v in rope.items() if not (k == "rope_type" and v == "default")} or None
    head = target.get_output_embeddings()
    vocab = int(head.weight.shape[0] if head is not None else config.vocab_size)
    return Eagle3Layout(hidden, vocab, int(draft_vocab_size or vocab), heads, kv_heads, head_dim, inner,
                        tuple(feature_layers), rope_theta=theta, rope_scaling=scaling,
                        max_position_embeddings=int(getattr(config, "max_position_embeddings", 2048) or 2048),
                        norm_eps=float(getattr(config, "rms_norm_eps", 1e-6) or 1e-6), **flags)


def most_frequent_tokens(stream: torch.Tensor, count: int, vocab_size: int) -> torch.Tensor:
    """[count] the target ids most frequent in `stream` (ties: lower id first), ascending - EAGLE-3's
    draft vocabulary."""
    counts = torch.bincount(stream.flatten().long(), minlength=vocab_size)[:vocab_size]
    order = torch.sort(-counts, stable=True).indices[:count]
    return order.sort().values
