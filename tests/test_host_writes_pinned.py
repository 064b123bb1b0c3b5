"""Host data reaches the device without stalling it: on CUDA, `torch.tensor(list, device="cuda")`
copies from pageable memory, a synchronising copy that tests/test_cuda_syncs.py catches only on a
GPU (it found such copies in prompt lookup, suffix, the draft model's catch-up, EAGLE's features and
the batch's row moves). The code that runs per call or per step builds host data on the host and
moves it with `specdec.tree.host_to_device` / `to_device` (pinned memory, non_blocking). This test
holds that rule on a CPU by reading the source: no `torch.tensor` / `as_tensor` / `asarray` with a
`device=` argument in those modules."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# load-time probes and training, where a blocking copy costs nothing per step
EXEMPT = {"specdec/check.py", "specdec/models.py", "specdec/config_reference.py", "heads/train.py",
          "heads/eagle_train.py", "heads/distill.py", "heads/distill_loss.py", "heads/data.py"}
FOLDERS = ("specdec", "strategies", "heads")
MAKERS = {"tensor", "as_tensor", "asarray"}


def device_copies(source: str) -> list[int]:
    """Lines of `torch.tensor(..., device=...)`-like calls in `source`, outside `host_to_device`
    itself (which makes one only where the device is not a GPU)."""
    lines = []
    tree = ast.parse(source)
    allowed = {id(node) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name == "host_to_device"
               for node in ast.walk(fn)}
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MAKERS
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and any(k.arg == "device" for k in node.keywords)):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_pageable_copy():
    assert device_copies("import torch\nx = torch.tensor([1, 2], device=d)\ny = torch.tensor([1])\n") == [2]


def test_no_pageable_host_to_device_copies_in_the_hot_code():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT:
                continue
            found += [f"{rel}:{line}" for line in device_copies(path.read_text())]
    assert not found, ("torch.tensor(..., device=...) copies from pageable memory (a CUDA sync); build it on the "
                       f"host and use specdec.tree.host_to_device: {found}")
