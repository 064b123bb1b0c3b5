"""The packed split.json cut to the files this machine's standard library has (another Python version may
lack some): python scripts/gpu/local_split.py PACKED_SPLIT OUT_SPLIT. Prints kept/all per list."""
import json
import os
import sys
import sysconfig

packed, out = sys.argv[1:3]
split = json.load(open(packed))
root = sysconfig.get_paths()["stdlib"]
kept = {k: [f for f in v if os.path.exists(os.path.join(root, f))] for k, v in split.items() if isinstance(v, list)}
json.dump(kept, open(out, "w"))
print({k: f"{len(kept[k])}/{len(v)}" for k, v in split.items() if isinstance(v, list)})
