# bf16 autocast against fp32, one torch thread: the target forward + the draft forward/backward of one
# shipped-config batch (4 x 256), 3 interleaved repeats. Run from the repository root.
import time, torch
from specdec.models import load_model
torch.set_num_threads(1)
t = load_model("../shared/models/pycode/target", "target", torch.device("cpu"), torch.float32, key="target")
d = load_model("../shared/models/pycode/draft", "draft", torch.device("cpu"), torch.float32, key="draft")
ids = torch.randint(1, 4000, (4, 256))
res = {False: [], True: []}
for rep in range(3):
    for bf in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf):
            a = time.perf_counter()
            with torch.no_grad(): t(input_ids=ids)
            out = d(input_ids=ids).logits.float().sum(); out.backward()
            res[bf].append(time.perf_counter() - a)
for bf, v in res.items(): print("bf16" if bf else "fp32", [round(x, 2) for x in v])
