"""EAGLE-1 feature drafter: one decoder layer that autoregresses in the target's feature space.

Row t of the drafter reads the target's last hidden state at position t and the embedding of
token t + 1, fused as `fc([g_t; embed(x_{t+1})])`, runs one decoder block (RMSNorm, rotary attention over its
own KV cache, SwiGLU MLP, the shape of a Llama layer sized like the target) and a final RMSNorm.
Its output o_t stands for the target's feature at t + 1; the target's own frozen lm_head turns it
into a distribution for token t + 2. Deeper draft steps feed the drafter its own output and the
drafted token (g_{t+1} = o_t), so a chain or tree of guesses needs no target forward.

EagleLayout.feature_layers names the one layer read, an index into Hugging Face's `hidden_states`
tuple: (-1,), the last hidden state after the final norm (what the lm_head reads), g_t = f_t;
training may also regress o_t onto f_{t+1}. EAGLE-3 (several layers fused, its own reduced-vocabulary
lm_head) is the standard module of specdec.heads.eagle3, with the same call interface.

Attention is given as an explicit boolean visibility mask over [past keys; new keys], so the same
block serves a causal pass over committed rows, one batched pass over a tree level (each node
sees the committed rows, its tree ancestors and itself) and the unrolled training pass.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from specdec.cache import BufferedLayer
from specdec.int8_linear import linear_group
from specdec.strategies.draft_vocab import project
from specdec.tree import host_to_device


@dataclass(frozen=True)
class EagleLayout:
    hidden_size: int                     # H: the target's hidden size
    vocab_size: int                      # V: the width of the target's logits
    num_heads: int                       # attention heads of the drafter's layer
    intermediate_size: int               # SwiGLU width
    feature_layers: tuple[int, ...] = (-1,)   # the target hidden_states index read (one)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if len(self.feature_layers) != 1:
            raise ValueError(f"an EAGLE-1 drafter reads one target layer, got feature_layers={list(self.feature_layers)}: "
                             f"several layers are the EAGLE-3 drafter's (specdec.heads.eagle3)")

    fused = False          # one layer read as is (EAGLE-3's layouts fuse several)
    name = "eagle1"

    @property
    def feature_size(self) -> int:
        return len(self.feature_layers) * self.hidden_size

    @property
    def width(self) -> int:
        """The drafter's own hidden size (g and its outputs): the target's."""
        return self.hidden_size

    def as_dict(self) -> dict:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return d


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """A low, a middle and a high layer of a target with `num_layers` decoder layers, as indices
    into `hidden_states` (i = the output of layer i; EAGLE-3 reads layers 2, L/2 and L - 3). Where
    those repeat (under 7 layers) and the target has 4 or more, three distinct layers spread over
    1..L-1 instead: speculators (and vLLM) refuse repeated target layers. Under 4 layers there are
    no three distinct inner layers, and they repeat (the trainer then asks for feature_layers)."""
    low = min(2, num_layers)
    high = max(num_layers - 3, 1)
    layers = (low, max(num_layers // 2, 1), max(high, low))
    if len(set(layers)) < 3 and num_layers >= 4:
        layers = (1, num_layers // 2, num_layers - 1)
    return layers


def layout_for_target(target, feature_layers=(-1,), intermediate_size: int | None = None) -> EagleLayout:
    """The EAGLE-1 layout shaped like one layer of `target` (intermediate_size: a narrower (or wider)
    SwiGLU than the target's, None = the target's own)."""
    config = target.config
    hidden = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None) or max(1, hidden // 64))
    if hidden % heads:
        heads = 1
    inner = (intermediate_size or getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
             or 4 * hidden)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(config, "rope_theta", None) or 10000.0
    head = target.get_output_embeddings()
    vocab = head.weight.shape[0] if head is not None else int(config.vocab_size)
    return EagleLayout(hidden, int(vocab), heads, int(inner), tuple(feature_layers), float(theta))


_INV_FREQ: dict[tuple, torch.Tensor] = {}


def rotary(positions: torch.Tensor, d: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding's (cos, sin) [B, 1, n, d] for positions [B, n]: computed once per forward
    for both q and k, with the frequencies kept per (d, theta, device) - recomputing them per call cost
    more than the rotation on a drafter's few rows."""
    key = (d, float(theta), positions.device)
    inv_freq = _INV_FREQ.get(key)
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))   # [d/2]
        _INV_FREQ[key] = inv_freq
    angles = positions.to(torch.float32)[..., None] * inv_freq                                   # [B, n, d/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]                                        # [B, 1, n, d]
    return angles.cos().to(dtype), angles.sin().to(dtype)


_ROTARY_TABLES: dict[tuple, torch.Tensor] = {}


def rotary_table(d: int, theta: float, dtype: torch.dtype, device: torch.device, positions: int) -> torch.Tensor:
    """[P, 2, 1, 1, d] (cos, signed sin) of rotary positions 0..P-1 (P >= positions), kept per (d, theta,
    dtype, device) and doubled when outgrown: a cached forward reads its rows' cos / sin with one
    indexing op instead of computing them (rotary: six ops, each a fixed cost on a drafter's few rows).
    The sin's first half is negated, so rotate-half's x * cos + cat(-x2, x1) * sin is
    x * cos + roll(x, d/2) * signed sin: one op for the rotation instead of four."""
    key = (d, float(theta), dtype, device)
    table = _ROTARY_TABLES.get(key)
    if table is None or table.shape[0] < positions:
        size = max(positions, 2 * (0 if table is None else table.shape[0]), 1024)
        cos, sin = rotary(torch.arange(size, device=device)[None], d, theta, torch.float32)     # [1, 1, P, d]
        sin = sin[0, 0].clone()
        sin[:, : d // 2] *= -1
        table = torch.stack([cos[0, 0], sin], dim=1)[:, :, None, None].to(dtype)                # [P, 2, 1, 1, d]
        _ROTARY_TABLES[key] = table
    return table


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half form: x [B, heads, n, d] with cos / sin [B, 1, n, d]."""
    d = x.shape[-1]
    first, second = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class RaggedRows:
    """The drafter's keys / values for the rows of a batch, side by side (strategies/eagle_batch.py):
    buffers [rows, heads, capacity, d], each row filled to its own length. Before a forward the batch
    calls `prepare` with the rows it runs, where each writes its new entries and how many slots the
    forward attends over; the block's update then writes row i's n entries at start[i] .. start[i] + n
    and reads the first `width` slots of those rows. Capacity grows by doubling."""

    def __init__(self):
        self.key_buffer = self.value_buffer = None
        self.rows = 0                               # rows allocated
        self.index: torch.Tensor | None = None      # [b] the rows of this forward (None: all, in order)
        self.start: torch.Tensor | None = None      # [b] where each writes
        self.width = 0
        self.needed_rows = 0                        # rows the buffers must hold for this forward

    @property
    def capacity(self) -> int:
        return 0 if self.key_buffer is None else self.key_buffer.shape[2]

    def prepare(self, index: torch.Tensor | None, start: torch.Tensor, width: int, needed_rows: int) -> None:
        """needed_rows: 1 + the largest row of `index` (the batch knows it on the host: no read back)."""
        self.index, self.start, self.width, self.needed_rows = index, start, width, needed_rows

    def _reserve(self, like: torch.Tensor, rows: int, slots: int) -> None:
        if self.key_buffer is not None and rows <= self.rows and slots <= self.capacity:
            return
        capacity = self.capacity if slots <= self.capacity else max(slots, 2 * self.capacity)
        rows = max(rows, self.rows)
        keys = like.new_zeros(rows, like.shape[1], capacity, like.shape[-1])
        values = like.new_zeros(rows, like.shape[1], capacity, like.shape[-1])
        if self.key_buffer is not None:
            keys[: self.rows, :, : self.capacity] = self.key_buffer
            values[: self.rows, :, : self.capacity] = self.value_buffer
        self.key_buffer, self.value_buffer, self.rows = keys, values, rows

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k / v [b, heads, n, d] of the prepared rows -> their keys / values [b, heads, width, d]."""
        b, _, n, _ = k.shape
        rows = self.index if self.index is not None else torch.arange(b, device=k.device)      # [b]
        self._reserve(k, self.needed_rows, self.width)
        slots = self.start[:, None] + torch.arange(n, device=k.device)                         # [b, n]
        self.key_buffer[rows[:, None], :, slots] = k.transpose(1, 2)                           # [b, n, heads, d]
        self.value_buffer[rows[:, None], :, slots] = v.transpose(1, 2)
        if self.index is None and b == self.rows:          # every row, in order: views, nothing copied
            return self.key_buffer[:, :, : self.width], self.value_buffer[:, :, : self.width]
        # the rows' first `width` slots only (the buffers hold up to twice that: capacity doubles)
        return (self.key_buffer[:, :, : self.width].index_select(0, rows),
                self.value_buffer[:, :, : self.width].index_select(0, rows))

    def drop(self, order: list[int]) -> None:
        """Keep the rows `order` (old row of each new one), in that order."""
        if self.key_buffer is not None:
            index = host_to_device(order, self.key_buffer.device)
            self.key_buffer = self.key_buffer.index_select(0, index)
            self.value_buffer = self.value_buffer.index_select(0, index)
        self.rows = len(order)


def write_rows(cache: BufferedLayer, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Store k / v [1, heads, n, d] at rows start..start+n of `cache` (start <= the rows it holds;
    the rows after `start` are dropped first: a rolled-back tree's) and return the keys / values
    of rows 0..start+n (views).
    The buffer is preallocated and grows by doubling, so a tree level writes its n rows instead of
    copying every row before them (a torch.cat per drafter forward costs O(context) per depth).
    A RaggedRows cache (a batch's rows, k / v [B, heads, n, d]) writes where its `prepare` said and
    returns its rows' keys / values [B, heads, width, d]."""
    if isinstance(cache, RaggedRows):
        return cache.update(k, v)
    return cache.overwrite_from(start, k, v)


def attend(q, k, v, past_k=None, past_v=None, visible=None, cache: BufferedLayer | RaggedRows | None = None,
           start: int = 0, enable_gqa: bool = False) -> torch.Tensor:
    """A drafter layer's attention: q [B, heads, n, d] over the past and the new k / v [B, kv_heads, n, d];
    the past is past_k / past_v [B, kv_heads, L, d] (training) or `cache` (inference: write_rows). visible
    [B or 1, n, L + n] bool (None: causal over the new rows, all past visible). Returns [B, heads, n, d]
    in q's dtype.

    In inference on a CPU a bfloat16 / float16 drafter attends in float32 over a float32 cache: the
    CPU's half-precision attention kernel is several times slower than its float32 one where few
    queries read many keys (a batch's tree level: one query per row over its whole context), and the
    keys / values then cost one conversion per new row instead of one per read."""
    dtype = q.dtype
    if cache is not None:
        if q.device.type == "cpu" and dtype != torch.float32:
            q, k, v = q.float(), k.float(), v.float()
        keys, values = write_rows(cache, start, k, v)                          # [B, kv_heads, L + n, d]
    else:
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)       # [B, kv_heads, L + n, d]
        values = v if past_v is None else torch.cat([past_v, v], dim=2)
    if visible is None:
        n, total = q.shape[2], keys.shape[2]
        visible = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)[None]
    attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[:, None], enable_gqa=enable_gqa)
    return attn.to(dtype)


class DrafterBlock(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, layout: EagleLayout):
        super().__init__()
        h = layout.hidden_size
        self.num_heads, self.theta = layout.num_heads, layout.rope_theta
        self.attn_norm = nn.RMSNorm(h, eps=layout.norm_eps)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.mlp_norm = nn.RMSNorm(h, eps=layout.norm_eps)
        self.gate_proj = nn.Linear(h, layout.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, layout.intermediate_size, bias=False)
        self.down_proj = nn.Linear(layout.intermediate_size, h, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:     # [B, n, H] -> [B, heads, n, d]
        b, n, h = x.shape
        return x.view(b, n, self.num_heads, h // self.num_heads).transpose(1, 2)

    def forward(self, x, positions, past_k=None, past_v=None, visible=None, cache: BufferedLayer | None = None,
                start: int = 0):
        """x [B, n, H], positions [B, n]; past_k / past_v [B, heads, L, d] (or None);
        visible [B or 1, n, L + n] bool (None: causal over the new rows, all past visible).
        cache (inference, B = 1): instead of past_k / past_v, the past is rows 0..start of `cache`
        (L = start) and the new rows are written there, at start..start+n; a RaggedRows cache (a
        batch's rows, B >= 1) writes and reads where its `prepare` said (start unused).
        Returns (x [B, n, H], k [B, heads, n, d], v [B, heads, n, d]) - the new rows' keys and values."""
        b, n, hidden = x.shape
        h = self.attn_norm(x)
        q, k, v = self._rotated_qkv(h, positions, cache, start)                           # [B, heads, n, d] each
        attn = attend(q, k, v, past_k, past_v, visible, cache, start)                     # [B, heads, n, d]
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, n, hidden))
        h = self.mlp_norm(x)
        gate_up = self.__dict__.get("_gate_up")
        gate, up = gate_up(h) if gate_up is not None else (self.gate_proj(h), self.up_proj(h))     # [B, n, I]
        x = x + self.down_proj(F.silu(gate) * up)
        return x, k, v

    def _rotated_qkv(self, h, positions, cache, start: int):
        """h [B, n, H] -> q, k (rotated), v [B, heads, n, d]. Over a cache, where q/k/v run as one product
        (group_projections), q and k are rotated together from a kept rotary table: about 40% fewer
        dispatched ops per forward, each a kernel launch on a GPU (on a CPU a drafter forward between
        verifies is bound by cold caches instead: benchmarks/results/eagle_fused). Otherwise (training,
        no cache, layers taking gradients) each is rotated on its own, as computed for its positions."""
        b, n, hidden = h.shape
        heads = self.num_heads
        d = hidden // heads
        qkv_group = self.__dict__.get("_qkv")
        qkv = qkv_group.fused(h) if cache is not None and qkv_group is not None else None   # [B, n, 3H]
        if qkv is not None:
            qkv = qkv.view(b, n, 3, heads, d)
            # the rotary rows this forward reads: a cache's new rows sit at positions below its end (a tree
            # level's nodes at their depth, committed rows at their index), a batch's below its width
            end = cache.width if isinstance(cache, RaggedRows) else start + n
            cos, signed_sin = rotary_table(d, self.theta, h.dtype, h.device, end)[positions].unbind(2)  # [B, n, 1, 1, d]
            qk = qkv[:, :, :2]                                                      # [B, n, 2, heads, d]
            qk = qk * cos + qk.roll(d // 2, dims=-1) * signed_sin
            q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)
            return q, k, qkv[:, :, 2].transpose(1, 2)
        q, k, v = qkv_group(h) if qkv_group is not None else (self.q_proj(h), self.k_proj(h), self.v_proj(h))
        cos, sin = rotary(positions, d, self.theta, h.dtype)                               # [B, 1, n, d]
        return apply_rotary(self._split(q), cos, sin), apply_rotary(self._split(k), cos, sin), self._split(v)

    def group_projections(self) -> None:
        """Run q, k, v (and gate, up), which read the same input, as one product each (packed where
        their layers run packed weights, stacked where they are small: specdec.row_linear.PackedGroup),
        else each on its own: one call's fixed cost instead of three, in every drafter forward."""
        self._qkv = linear_group([self.q_proj, self.k_proj, self.v_proj])
        self._gate_up = linear_group([self.gate_proj, self.up_proj])
        for group in (self._qkv, self._gate_up):
            if group is not None:
                group.prepare()                            # now, not inside a timed step
                for layer in group.layers:                 # the group's copy is the one used: theirs is freed
                    layer.__dict__.pop("_held", None)


class EagleDrafter(nn.Module):
    def __init__(self, layout: EagleLayout):
        super().__init__()
        self.layout = layout
        h = layout.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.block = DrafterBlock(layout)
        self.norm = nn.RMSNorm(h, eps=layout.norm_eps)
        self._shared_lm_head: list[nn.Module] = []     # the target's lm_head, outside state_dict()
        self._shared_embedding: list[nn.Module] = []   # the target's input embedding, likewise

    def attach_lm_head(self, lm_head: nn.Module) -> None:
        """Share the target's (frozen) output layer; it is not saved with the drafter."""
        self._shared_lm_head[:] = [lm_head]

    def attach_embedding(self, embedding: nn.Module) -> None:
        """Share the target's (frozen) input embedding; not saved."""
        self._shared_embedding[:] = [embedding]

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] outputs -> [..., V] logits over the drafter's vocabulary: the target's whole one."""
        return self.logits(out)

    def _shared(self, which: list, what: str) -> nn.Module:
        if not which:
            raise RuntimeError(f"the drafter uses the target's {what}: call attach_lm_head / attach_embedding "
                               f"with the target's modules first (load_eagle and the eagle strategy do)")
        return which[0]

    def input_features(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., H] -> the drafter's feature input g [..., H]: as they are."""
        return features

    uses_target_lm_head = True
    draft_vocab = None                  # the whole target vocabulary
    vocab_subset = None                 # draft_vocab's VocabSubset (strategies/draft_vocab.py), set by the eagle
    #                                     strategy: the lm_head reads only its kept tokens' rows, -inf elsewhere

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] drafter outputs -> [..., V] logits, through the target's own lm_head."""
        return project(self.vocab_subset, self._shared(self._shared_lm_head, "lm_head"), out)

    def forward(self, g, tokens, positions, past_k=None, past_v=None, visible=None, with_logits: bool = True,
                cache: BufferedLayer | None = None, start: int = 0):
        """g [B, n, H] feature inputs (input_features of target features, or earlier outputs),
        tokens [B, n] the token after each feature's position, positions [B, n]; past / visible /
        cache / start as DrafterBlock. Returns (out [B, n, H], logits [B, n, V] or None, k, v)."""
        embed = self._shared(self._shared_embedding, "input embedding")(tokens)               # [B, n, H]
        if embed.dtype != g.dtype:
            embed = embed.to(g.dtype)
        x = self.fc(torch.cat([g, embed], dim=-1))
        x, k, v = self.block(x, positions, past_k, past_v, visible, cache, start)
        out = self.norm(x)
        return out, (self.logits(out) if with_logits else None), k, v
