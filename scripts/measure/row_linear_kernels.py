"""The pycode target's 57 linear weights (8 layers x 7, plus the lm_head), each multiplied once by an
input of M rows, five ways, 2 torch threads; medians of 8 rounds (the first dropped), all M interleaved.
The last two are oneDNN's linear on packed weights (specdec.row_linear's packed_linear), laid out for
the default batch and for 16 rows (its ROWS_HINT).
Random weights of the target's shapes: only the shapes and the bytes matter for the time.

    python scripts/measure/row_linear_kernels.py
"""
import torch, time, statistics
torch.set_num_threads(2)
torch.manual_seed(0)
L = 8
shapes = [(512, 512)] * 4 + [(1536, 512)] * 2 + [(512, 1536)]
Ws = [torch.randn(o, i) * 0.02 for _ in range(L) for (o, i) in shapes] + [torch.randn(4096, 512) * 0.02]
WTs = [W.t().contiguous() for W in Ws]
import torch.nn.functional as F
def lin(x, k): return F.linear(x, Ws[k])
def mmt(x, k): return torch.mm(Ws[k], x.t()).t()
def nn_(x, k): return torch.mm(x, WTs[k])
packed = [torch.ops.mkldnn._reorder_linear_weight(W) for W in Ws]
packed16 = [torch.ops.mkldnn._reorder_linear_weight(W, 16) for W in Ws]
def onednn(x, k): return torch.ops.mkldnn._linear_pointwise(x, packed[k], None, "none", [], "")
def onednn16(x, k): return torch.ops.mkldnn._linear_pointwise(x, packed16[k], None, "none", [], "")
modes = {'F.linear': lin, 'mm(W,xT)': mmt, 'mm(x,WT_contig)': nn_, 'packed': onednn, 'packed(16)': onednn16}
res = {}
Ms = (1, 2, 3, 4, 8, 12, 16, 24, 64)
for rnd in range(9):
    for M in Ms:
        xs = {i: torch.randn(M, i) for i in (512, 1536)}
        for name, f in modes.items():
            t = time.perf_counter()
            for k, W in enumerate(Ws): f(xs[W.shape[1]], k)
            res.setdefault((M, name), []).append(time.perf_counter() - t)
for M in Ms:
    print(M, {n: round(statistics.median(res[(M, n)][1:]) * 1e3, 2) for n in modes})
