"""Microseconds of one linear layer's product at the demo family's sizes (128 x 128, 344 x 128, 128 x 344, the
2048 x 128 output layer) for 1 to 17 rows, one thread: PyTorch's own product (lin), oneDNN's on a packed weight
(pk), and input @ weight.T on a transposed copy (mmT).

    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 python row_products.py
"""
import time
import torch

torch.set_num_threads(1)


def timed(fn, n=2000):
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


for out_features, in_features in ((128, 128), (344, 128), (128, 344), (2048, 128)):
    weight = torch.randn(out_features, in_features)
    transposed = weight.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
    cells = []
    for rows in (1, 2, 5, 11, 17):
        x = torch.randn(rows, in_features)
        cells.append(f"r{rows}: lin {timed(lambda: torch.nn.functional.linear(x, weight)):5.1f} "
                     f"pk {timed(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, 'none', [], '')):5.1f} "
                     f"mmT {timed(lambda: torch.mm(x, transposed)):5.1f}")
    print(f"{out_features}x{in_features}", " | ".join(cells))
