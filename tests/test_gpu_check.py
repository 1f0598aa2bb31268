"""scripts/gpu_check.py on a CPU in small mode, in a process where Ray, FAISS, vLLM and Arrow cannot be imported
(the GPU machine it is for has torch and transformers, and carries only what docs/gpu-check.md lists)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402

from raypipe.retrieval.gpu_memory import clone_events  # noqa: E402

# The packages the GPU machine lacks, absent (None in sys.modules: imports fail, find_spec finds nothing), then
# the script as __main__.
RUN_WITHOUT = """
import runpy, sys
for name in ("ray", "faiss", "vllm", "pyarrow", "onnxruntime"):
    sys.modules[name] = None
sys.argv = ["gpu_check.py", "--device", "cpu", "--rows", "4000"]
runpy.run_path(%r, run_name="__main__")
"""


def test_gpu_check_runs_small_on_cpu_without_the_cluster_stack(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT % str(ROOT / "scripts" / "gpu_check.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "11 of 11 checks passed"
    checks = ("encoder", "cross", "Q-", "clone", "search")
    table = {line.split("  ")[0].strip(): line for line in lines if line.startswith(checks)}
    assert len(table) == 10 and "4,000 x 768" in table["search"] and "min cosine 1.00000" in table["encoder"]


def test_clone_replay_agrees_with_the_arithmetic_under_a_tight_cap():
    rows = 20_000  # peaks: cloner 1.61 GiB, paged float16 1.53 GiB, paged float32 1.56 GiB
    results = gpu_check.check_clone_replay("cpu", rows, 768, [1.55])
    assert [r.ok for r in results] == [True, True, True]
    assert "peak 1.61 GiB does not fit in 1.55 GiB: out of memory at 'float32 rows'" in results[0].detail
    assert results[1].detail.endswith(": fits")
    assert "out of memory at 'store'" in results[2].detail


def test_replay_reports_the_allocation_that_does_not_fit():
    events = clone_events(1000, 8, fp16=True, method="copy")
    assert gpu_check.replay(events, "cpu", cap=2 * 1024**3) is None
    assert gpu_check.replay(events, "cpu", cap=1024**3) == "temporary memory"
