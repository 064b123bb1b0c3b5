# One step of configs/train_draft.yaml, phase by phase (run from the repository root):
#   THREADS=1 TAU=1 .venv/bin/python benchmarks/results/distill/profile_step.py [key=value ...]
import time, sys, torch
from specdec.heads import distill as D
from specdec.heads.data import sample_windows, fixed_windows
from specdec.heads.train import training_streams
from specdec.models import load_model, load_tokenizer, DTYPES
import os
if os.environ.get("THREADS"): torch.set_num_threads(int(os.environ["THREADS"]))
ov = sys.argv[1:]
cfg = D.load_train_draft_config("train_draft", ov)
print("threads", torch.get_num_threads())
t=time.perf_counter()
target = load_model(cfg.target, "target", torch.device("cpu"), DTYPES[cfg.dtype], key="target"); target.requires_grad_(False)
tok = load_tokenizer(cfg.tokenizer or cfg.target, "target", key="tokenizer")
draft = D.load_draft(cfg, target, tok, torch.device("cpu")); draft.train()
print("load", time.perf_counter()-t, target.dtype, draft.dtype)
t=time.perf_counter()
tf, hf, ts, hs = training_streams(cfg, tok)
print("streams", time.perf_counter()-t)
t=time.perf_counter()
ho = D.HeldOut(cfg, target, tok, fixed_windows(hs, cfg.seq_len, cfg.eval_windows))
print("heldout init", time.perf_counter()-t)
t=time.perf_counter()
draft.eval()
with torch.no_grad():
    for ids, tl in ho.batches:
        draft(input_ids=ids)
print("eval windows", time.perf_counter()-t)
for temp in ((0.0, 0.8) if os.environ.get("TAU") else ()):
    t=time.perf_counter(); tau=ho.chain_tau(draft, temp); print("chain tau", temp, tau, time.perf_counter()-t)
draft.train()
g = torch.Generator().manual_seed(0)
opt = torch.optim.AdamW(draft.parameters(), lr=1e-4)
weights = D.loss_spec(cfg)
for step in range(3):
    T={}
    t=time.perf_counter(); w = sample_windows(ts, cfg.seq_len, cfg.batch_size, g); T['win']=time.perf_counter()-t
    t=time.perf_counter(); ids, first = D.make_batch(cfg, cfg.data, w, step, 0, target, tok, draft); T['gen']=time.perf_counter()-t
    t=time.perf_counter()
    with torch.no_grad(): tl = target(input_ids=ids).logits[:, first:-1]
    T['tgt']=time.perf_counter()-t
    t=time.perf_counter(); dl = draft(input_ids=ids).logits[:, first:-1]; T['dfwd']=time.perf_counter()-t
    t=time.perf_counter()
    loss, parts = D.distill_loss(weights, tl.float().flatten(0,1), dl.float().flatten(0,1), ids[:, first+1:].flatten(), temperature=cfg.loss_temperature)
    T['loss']=time.perf_counter()-t
    t=time.perf_counter(); opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0); opt.step(); T['bwd+opt']=time.perf_counter()-t
    print(step, {k: round(v,3) for k,v in T.items()}, "total", round(sum(T.values()),2))
