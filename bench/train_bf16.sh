#!/usr/bin/env bash
# bf16 mixed precision against f32 and against PyTorch's autocast on one training run:
# the quickstart run RUN's model, data, seed and AdamW settings, STEPS steps (default
# 300) on a cosine schedule, trained by `tinylm train` in fp32 and in bf16 from the
# same initial weights and batches, then repeated step for step by
# bench/torch_train.py in float32 (`eager`) and under bf16 autocast (`eager-bf16`).
# Prints every run's training loss at a few steps, its largest relative gap over
# all steps from the tinylm fp32 run and from PyTorch's autocast run, and its
# validation losses; exits 1 unless tinylm bf16 is within TOLERANCE (default 2e-3,
# half of bf16's unit roundoff 2^-8) of both at every step.
#
#   PYTHON=.venv-bench/bin/python TINYLM_PYTHON=target/venv-ci/bin/python \
#       bench/train_bf16.sh RUN [OUT_DIR]
#
# RUN is a `tinylm quickstart` run directory (config.json, train.npy, val.npy);
# PYTHON has torch and safetensors (bench/requirements.txt), TINYLM_PYTHON the tinylm
# package (`pip install .`), which writes the initial weights torch_train.py starts from.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TINYLM_PYTHON=${TINYLM_PYTHON:-python3}
STEPS=${STEPS:-300}
TOLERANCE=${TOLERANCE:-2e-3}
RUN=$1
OUT=${2:-runs/train-bf16-$(date -u +%Y%m%d-%H%M%S)}
cargo build --release -q -p tinylm-cli
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
mkdir -p "$OUT"
echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)," \
    "$(grep -qw avx512_bf16 /proc/cpuinfo && echo AVX512_BF16 || echo 'no AVX512_BF16')," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$RUN" "$OUT" "$STEPS" <<'PY'
import json, os, sys
run, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(os.path.join(run, "config.json")))
for key in ("train_data", "val_data"):
    cfg[key] = os.path.abspath(os.path.join(run, os.path.basename(cfg[key])))
cfg.update(steps=steps, schedule="steps", max_tokens=None, time_budget_s=None, cosine_steps=None,
           resume=None, eval_interval=100, eval_batches=0, checkpoint_interval=0, log_interval=1)
cfg.pop("out_dir", None)
json.dump(cfg, open(os.path.join(out, "train.json"), "w"), indent=1)
PY
for precision in fp32 bf16; do
    echo "== tinylm $precision ($STEPS steps) -> $OUT/tinylm-$precision"
    "$TINYLM" train --config "$OUT/train.json" --precision "$precision" --out-dir "$OUT/tinylm-$precision" \
        > "$OUT/tinylm-$precision.txt"
    head -1 "$OUT/tinylm-$precision.txt"
done
# The initial weights of the run's seed (the training loop's own initialization).
"$TINYLM_PYTHON" - "$OUT" <<'PY'
import json, sys
import numpy as np
import tinylm
from safetensors.numpy import save_file
out = sys.argv[1]
cfg = json.load(open(f"{out}/train.json"))
model = tinylm.TransformerLM(cfg["model"], seed=cfg["seed"])
save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in model.state_dict().items()},
          f"{out}/tinylm-fp32/init.safetensors")
PY
for variant in eager eager-bf16; do
    echo "== PyTorch $variant -> $OUT/torch-$variant"
    "$PYTHON" bench/torch_train.py --run "$OUT/tinylm-fp32" --variant "$variant" --threads 2 \
        --out "$OUT/torch-$variant" > "$OUT/torch-$variant.json"
done
python3 - "$OUT" "$STEPS" "$TOLERANCE" <<'PY'
import json, sys
out, steps, tolerance = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
names = ("tinylm-fp32", "tinylm-bf16", "torch-eager", "torch-eager-bf16")
runs = {n: list(map(json.loads, open(f"{out}/{n}/log.jsonl"))) for n in names}
loss = {n: {r["step"]: r["train_loss"] for r in rs if r.get("train_loss") is not None} for n, rs in runs.items()}
val = {n: [(r["step"], r["val_loss"]) for r in rs if r.get("val_loss") is not None] for n, rs in runs.items()}
def gap(a, b):
    return max(abs(loss[a][s] - loss[b][s]) / loss[b][s] for s in range(1, steps + 1))
shown = (1, 10, 50, 100, 200, steps)
print(f"{'run':<17} " + " ".join(f"step {s:>4}" for s in shown)
      + "  gap to tinylm-fp32  gap to torch-eager-bf16  validation")
for n in names:
    print(f"{n:<17} " + " ".join(f"{loss[n][s]:>9.4f}" for s in shown)
          + f"  {gap(n, 'tinylm-fp32'):>18.2e}  {gap(n, 'torch-eager-bf16'):>23.2e}  "
          + ", ".join(f"{s}: {v:.4f}" for s, v in val[n]))
worst = max(gap("tinylm-bf16", "tinylm-fp32"), gap("tinylm-bf16", "torch-eager-bf16"))
print(f"tinylm bf16: every step's loss within {worst:.1e} (relative) of tinylm fp32's and "
      f"PyTorch autocast's (tolerance {tolerance:.0e})")
sys.exit(0 if worst <= tolerance else 1)
PY
