#!/bin/bash
# The demo's code on three held-out prompts (../demo_avx2_family/prompts/), for each family home, rows autoregressive,
# eagle, token_recycling and auto, 3 timed runs each. Homes (SPECDEC_HOME), as NAME|HOME|FAMILY_CONFIG|held kernels:
#   OLD_AVX2, OLD_NATIVE: the 128 x 8 family (configs/default_family.yaml before c7df314), built with AVX2 / own kernels
#   NEW_AVX2, NEW_NATIVE: the 64 x 16 family (c7df314's), built the same two ways
# Run from the repository root: bash benchmarks/results/demo_family_resize/sweep.sh
AVX="ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2"
for fam in "old-avx2|$OLD_AVX2|$OLD_CONFIG|$AVX" "new-avx2|$NEW_AVX2||$AVX" "old-native|$OLD_NATIVE|$OLD_CONFIG|" "new-native|$NEW_NATIVE||"; do
  IFS='|' read name home cfg envs <<< "$fam"
  for p in gzip optparse threading; do
    echo "== family $name prompt $p"
    env $envs SPECDEC_HOME=$home ${cfg:+SPECDEC_FAMILY_CONFIG=$cfg} .venv/bin/python -m specdec.family.demo \
      --prompt-file benchmarks/results/demo_avx2_family/prompts/$p.txt --strategies autoregressive,eagle,token_recycling,auto \
      --repeats 3 2>&1 | grep -E "│|reference"
  done
done
