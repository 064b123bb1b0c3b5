cd "$(git rev-parse --show-toplevel)"   # TMP/home-demo, TMP/home: the two families (README.md)
for fam in TMP/home-demo TMP/home; do
  for f in gzip optparse threading; do
    echo "== family $fam prompt $f"
    SPECDEC_HOME=$fam .venv/bin/python -m specdec.family.demo --prompt-file benchmarks/results/demo_avx2_family/prompts/$f.txt --strategies autoregressive,eagle,token_recycling,auto --repeats 3 2>&1 | grep -a "│\|reference:"
  done
done
