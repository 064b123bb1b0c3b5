# Greedy chain tau (gamma 4, 128 new tokens) of the shipped and the distilled draft on 16 held-out windows of
# 512 tokens other than the training-time evaluation's, with 64- and 384-token prompts. From the repository root,
# after the 25-minute run (runs/distill-pycode).
import sys, time, torch
torch.set_num_threads(1)
from specdec.heads import distill as D
from specdec.heads.data import fixed_windows
from specdec.heads.train import training_streams
from specdec.models import load_model, load_tokenizer
from specdec.api import Speculator
from specdec.strategies.draft_model import DraftModel
cfg = D.load_train_draft_config("train_draft", [])
target = load_model(cfg.target, "target", torch.device("cpu"), torch.float32, key="target")
tok = load_tokenizer(cfg.target, "target", key="tokenizer")
drafts = {"shipped": load_model(cfg.draft, "draft", torch.device("cpu"), torch.float32, key="d"),
          "distilled": load_model("runs/distill-pycode", "draft", torch.device("cpu"), torch.float32, key="d")}
_, _, _, hs = training_streams(cfg, tok, False)
w = fixed_windows(hs, 512, 16)
for plen in (64, 384):
    prompts = [r[-128 - plen:-128].tolist() for r in w]
    for name, d in drafts.items():
        t = time.perf_counter()
        outs = Speculator(target, tok, DraftModel(d, num_tokens=4)).generate(prompts, max_new_tokens=128, ignore_eos=True)
        per = [o.stats.new_tokens / o.stats.target_forwards for o in outs]
        print(f"prompt {plen} {name}: tau greedy {sum(o.stats.new_tokens for o in outs)/sum(o.stats.target_forwards for o in outs):.3f} per-prompt {[round(x,2) for x in per]} ({time.perf_counter()-t:.0f}s)", flush=True)
