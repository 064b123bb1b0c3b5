"""What kind of difference it is when a greedy output parts from its reference.

At the first new token where the two outputs part, the target is run once more, plainly (no cache,
one row) over the prompt and the reference's common prefix, with the logits processing both
outputs ran with (the checkpoint's generation_config), and the two tokens' logits there are set
against the top logit:

* **tie**: both equal the top. Either token is a correct argmax; which one a kernel returns
  depends on its summation order.
* **near tie**: one of them is the top and the other within one unit in the last place of it in
  the model's dtype. A cached one-token step, a tree forward and a plain recompute round
  differently by that much.
* **mismatch**: anything else, or outputs of different lengths: a bug.

Ties and near ties are excused only in half precision (bfloat16, float16), where a tree forward
is not bit-identical to a one-row forward (docs/sampling.md). In float32 the outputs must be
token-identical, so every difference there fails, whatever its kind; the kind is still recorded,
to say where to look. `specdec bench` and scripts/gpu/bf16_identity.py both classify with this
module.
"""
from __future__ import annotations

import math

import torch

from specdec.check import first_divergence
from specdec.processing import generation_processors

TIE, NEAR_TIE, MISMATCH = "tie", "near_tie", "mismatch"
HALF_PRECISION = (torch.bfloat16, torch.float16)


def ulp(value: float, dtype: torch.dtype) -> float:
    """One unit in the last place of `value` in `dtype`: the spacing of dtype's numbers at |value|
    (0 for 0, so that only an exact tie passes there)."""
    if not value or not math.isfinite(value):
        return 0.0
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(value)))


def kind_of(logit_ours: float, logit_reference: float, top: float, dtype: torch.dtype) -> str:
    """TIE, NEAR_TIE or MISMATCH for the two tokens' logits and the top logit at one position."""
    if logit_ours == logit_reference == top:
        return TIE
    if max(logit_ours, logit_reference) == top and abs(logit_ours - logit_reference) <= ulp(top, dtype):
        return NEAR_TIE
    return MISMATCH


def excused(kind: str, dtype: torch.dtype) -> bool:
    """Whether a difference of this kind is allowed in `dtype`: ties, in half precision only."""
    return kind != MISMATCH and dtype in HALF_PRECISION


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def unclassified(position: int) -> dict:
    """A difference at new token `position` that is not looked into (sampled outputs; a turn whose prompt an
    earlier difference already changed): a mismatch."""
    return {"position": position, "kind": MISMATCH, "excused": False}


@torch.inference_mode()
def classify(model, prompt_ids: list[int], ours: list[int], reference: list[int],
             generation_config=None) -> dict | None:
    """None when `ours` equals `reference` (both the new tokens after `prompt_ids`); else where and
    how they part: {position, kind, excused, dtype} and, when both have a token there, the two
    tokens (ours, reference), their logits after the logits processing of `generation_config` (the
    one both outputs ran with; default the model's own) (logit_ours, logit_reference), the top logit
    and its ulp."""
    at = first_divergence(ours, reference)
    if at is None:
        return None
    dtype = model.dtype
    difference = {**unclassified(at), "dtype": dtype_name(dtype)}
    if at >= min(len(ours), len(reference)):           # one output is longer: never a tie
        return difference
    context = prompt_ids + reference[:at]
    ids = torch.tensor([context], device=model.device)                              # [1, L]
    logits = model(ids).logits[:, -1]                                               # [1, V], model dtype
    saved = model.generation_config
    model.generation_config = generation_config or saved
    try:
        processors = generation_processors(model, prompt_ids, max(len(ours), len(reference)))
    finally:
        model.generation_config = saved
    logits = processors(ids, logits)[0]                                             # [V]
    a, b, top = logits[ours[at]].item(), logits[reference[at]].item(), logits.max().item()
    kind = kind_of(a, b, top, dtype)
    difference.update(kind=kind, excused=excused(kind, dtype), ours=ours[at], reference=reference[at],
                      logit_ours=a, logit_reference=b, top=top, ulp=ulp(top, dtype))
    return difference


def describe(difference: dict) -> str:
    """One line for a console: where the outputs part and what kind of difference it is."""
    where = f"at new token {difference['position']}"
    if "top" not in difference:
        return f"{where}: the outputs differ in length"
    kind = {TIE: "an exact tie", NEAR_TIE: "a near tie (within one ulp)", MISMATCH: "a mismatch"}[difference["kind"]]
    verdict = "" if difference["excused"] or difference["kind"] == MISMATCH else \
        f", not excused in {difference['dtype']} (only half precision may differ)"
    return (f"{where}: {kind} (token {difference['ours']}, logit {difference['logit_ours']:.6g}, against the "
            f"reference's token {difference['reference']}, logit {difference['logit_reference']:.6g}; top "
            f"{difference['top']:.6g}){verdict}")
