"""AVX2 code paths on an AVX-512 machine, for ``benchmarks/first_run.py --emulate-avx2`` (on PYTHONPATH).

torch.cpu then reports no AVX-512 (nor AVX512-BF16, VNNI, AMX), so vLLM loads its AVX2 kernels
(``vllm._C_AVX2``) as on an AVX2-only CPU; the script also caps ATen, oneDNN and MKL at AVX2 with their own
variables and runs the engine in float32, as ``engine.dtype=auto`` does there. Not emulated: ONNX
Runtime's kernels, and the other CPU's cores, caches and memory, so an AVX2 machine can still be slower.
"""

import importlib.abc
import importlib.util
import sys

REPORTED_ABSENT = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_avx512_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


class _PatchTorchCpu(importlib.abc.MetaPathFinder):
    """Patches ``torch.cpu`` right after it is imported, so no process pays for importing torch early."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cpu":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for name in REPORTED_ABSENT:
                if hasattr(module, name):
                    setattr(module, name, lambda: False)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchTorchCpu())
