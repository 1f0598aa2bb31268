"""The flat index onto GPUs without faiss's cloner's 2x peak: the memory arithmetic, the pre-flight check
before the index file is read, and the paged clone (a fake of faiss's GPU classes backed by CPU indexes,
so the real faiss-cpu searches the result)."""

import json
import types

import faiss
import numpy as np
import pytest

from raypipe.retrieval import index as index_mod
from raypipe.retrieval.gpu_memory import (
    TEMP_MEMORY_BYTES,
    WIKI18_ROWS,
    GpuClonePlan,
    GpuMemoryError,
    check_gpu_memory,
    clone_events,
    peak_bytes,
)
from raypipe.retrieval.index import FAISS_FILE, IndexDir, IndexMismatchError, SearchParams, read_faiss, to_gpus

GB = 10**9
L40S_FREE = 47 * GB  # a 48 GB L40S (46,068 MiB = 48.3 GB) with the CUDA context's share used


def wiki18(gpus: int, shard: bool, fp16: bool = True) -> GpuClonePlan:
    return GpuClonePlan(count=WIKI18_ROWS, dim=768, gpus=gpus, shard=shard, fp16=fp16)


def test_wiki18_by_hand():
    one = wiki18(1, shard=True)
    assert one.store_bytes == 21_015_324 * 768 * 2 == 32_279_537_664  # 32.3 GB
    # store + 1.5 GiB of faiss temporary memory + the norms twice (old beside new at the last page)
    assert one.peak_bytes == pytest.approx(32.28 * GB + 1.61 * GB + 0.168 * GB, rel=1e-3)
    check_gpu_memory(one, [L40S_FREE])  # fp16 on one 48 GB L40S: fits
    with pytest.raises(GpuMemoryError, match=r"needs 66\.3 GB on each GPU .* GPU 0 has 47\.0 GB free"):
        check_gpu_memory(wiki18(1, shard=True, fp16=False), [L40S_FREE])  # fp32: 64.6 GB store
    with pytest.raises(GpuMemoryError, match=r"21,015,324 x 768 vectors, float16 .*shard over 1 GPU.*needs 34\.1 GB"):
        check_gpu_memory(one, [24 * GB])  # one 24 GB card
    two = wiki18(2, shard=True)
    assert two.rows == 10_507_662 and two.peak_bytes == pytest.approx(16.14 * GB + 1.61 * GB + 0.084 * GB, rel=1e-3)
    check_gpu_memory(two, [24 * GB, 24 * GB])  # sharded over two 24 GB cards: fits
    with pytest.raises(GpuMemoryError, match="GPU 1 has 10.0 GB free"):
        check_gpu_memory(two, [24 * GB, 10 * GB])
    with pytest.raises(GpuMemoryError, match="replicate over 2 GPUs"):
        check_gpu_memory(wiki18(2, shard=False), [24 * GB, 24 * GB])  # a full copy on each


def test_faiss_cloner_peak_is_the_old_120_gib():
    copy = peak_bytes(clone_events(WIKI18_ROWS, 768, fp16=True, method="copy"))
    assert copy == TEMP_MEMORY_BYTES + WIKI18_ROWS * 768 * (4 + 2 + 2) + 0  # norms come after the temporaries go
    assert copy / 1024**3 == pytest.approx(121.75, abs=0.01) and copy > 80 * 1024**3


class FakeGpu:
    """faiss's GPU namespace, backed by CPU flat indexes (float32: stand-ins for the GPU's stores); records
    each index's device, precision and add calls."""

    GpuMultipleClonerOptions = object

    def __init__(self, n_gpus: int):
        self.n_gpus = n_gpus
        self.made: list[dict] = []
        self.IndexShards, self.IndexReplicas = faiss.IndexShards, faiss.IndexReplicas

    def get_num_gpus(self):
        return self.n_gpus

    def StandardGpuResources(self):  # faiss's names
        return object()

    def GpuIndexFlatConfig(self):
        return types.SimpleNamespace(device=None, useFloat16=False)

    def GpuIndexFlat(self, resources, d, metric, config):
        record = {"device": config.device, "fp16": config.useFloat16, "adds": []}
        self.made.append(record)

        class Part(faiss.IndexFlat):
            def add(self, x):
                record["adds"].append((len(x), x.flags.owndata))
                super().add(x)

        return Part(d, metric)


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1001, 32)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_index(vectors, tmp_path, factory="Flat"):
    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / FAISS_FILE))
    return read_faiss(tmp_path / FAISS_FILE, mapped=True)


@pytest.mark.parametrize("shard,gpus", [(True, 3), (True, 1), (False, 2)])
def test_paged_clone_searches_as_the_original(vectors, tmp_path, shard, gpus):
    original = write_index(vectors, tmp_path)
    fake = FakeGpu(gpus)
    cloned = to_gpus(original, shard=shard, gpu=fake)
    expected_rows = [333, 334, 334] if shard and gpus == 3 else [1001] * gpus
    assert [m["device"] for m in fake.made] == list(range(gpus)) and all(m["fp16"] for m in fake.made)
    # one add per GPU (faiss reserves once and pages it), of a view of the mapped file (no copy)
    assert [m["adds"] for m in fake.made] == [[(n, False)] for n in expected_rows]
    assert cloned.ntotal == 1001
    queries = vectors[::50] + 0.01
    d0, i0 = original.search(queries, 10)
    d1, i1 = cloned.search(queries, 10)
    np.testing.assert_array_equal(i1, i0)  # FAISS id i is row i on every shard
    np.testing.assert_allclose(d1, d0, rtol=1e-6)


def test_sqfp16_index_is_decoded_per_gpu(vectors, tmp_path):
    original = write_index(vectors, tmp_path, "SQfp16")
    fake = FakeGpu(2)
    cloned = to_gpus(original, shard=True, gpu=fake)
    assert [m["adds"] for m in fake.made] == [[(500, True)], [(501, True)]]
    queries = vectors[::50] + 0.01
    np.testing.assert_array_equal(cloned.search(queries, 10)[1], original.search(queries, 10)[1])


def test_other_index_types_use_faiss_cloner(vectors):
    ivf = faiss.index_factory(32, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    calls = []
    fake = FakeGpu(2)
    fake.GpuMultipleClonerOptions = lambda: types.SimpleNamespace()
    fake.index_cpu_to_all_gpus = lambda index, co: calls.append((index, co.shard, co.useFloat16)) or "cloned"
    assert to_gpus(ivf, shard=True, gpu=fake) == "cloned" and calls == [(ivf, True, True)] and not fake.made


@pytest.fixture
def gpu_index_dir(tmp_path):
    """An index directory whose manifest says wiki-18 and whose index.faiss is no FAISS file: reading it fails."""
    (tmp_path / "manifest.json").write_text(json.dumps({"count": WIKI18_ROWS, "dimension": 768, "factory": "Flat"}))
    for name in (FAISS_FILE, "docs.parquet", "df_plain.arrow"):
        (tmp_path / name).write_bytes(b"not read")
    return tmp_path


def test_pre_flight_refuses_before_reading_the_index(gpu_index_dir, monkeypatch):
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1, raising=False)
    monkeypatch.setattr(index_mod, "free_gpu_memory", lambda gpus: [24 * GB] * gpus)
    monkeypatch.setattr(index_mod, "read_faiss", lambda *a: pytest.fail("the index file was read"))
    with pytest.raises(GpuMemoryError, match=r"^index .* needs 34\.1 GB on each GPU .* GPU 0 has 24\.0 GB free"):
        IndexDir(gpu_index_dir).faiss_index(SearchParams(faiss_gpu="shard"))


def test_pre_flight_passes_then_reads_mapped(gpu_index_dir, monkeypatch):
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2, raising=False)
    monkeypatch.setattr(index_mod, "free_gpu_memory", lambda gpus: [24 * GB] * gpus)
    read = []
    monkeypatch.setattr(index_mod, "read_faiss", lambda path, mapped: read.append(mapped) or faiss.IndexFlatIP(768))
    with pytest.raises(IndexMismatchError, match="FAISS index has 0 x 768"):  # read after the check passed
        IndexDir(gpu_index_dir).faiss_index(SearchParams(faiss_gpu="shard", mmap=False))
    assert read == [True]  # sharded over two 24 GB GPUs fits; the clone adds from the mapped file


def test_free_memory_from_nvidia_smi_for_the_visible_gpus(monkeypatch):
    """Without a CUDA torch (this machine's), the free memory comes from nvidia-smi, for the GPUs Ray made visible."""
    import subprocess

    out = "0, 40000\n1, 30000\n2, 20000\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout=out))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert index_mod.free_gpu_memory(2) == [20000 * 1024**2, 40000 * 1024**2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert index_mod.free_gpu_memory(1) is None  # no GPU visible: no answer (the clone then refuses anyway)


def test_indexes_faiss_clones_are_not_checked(gpu_index_dir, monkeypatch):
    (gpu_index_dir / "manifest.json").write_text(
        json.dumps({"count": WIKI18_ROWS, "dimension": 768, "factory": "IVF16384,PQ96x8"})
    )
    monkeypatch.setattr(index_mod, "free_gpu_memory", lambda gpus: pytest.fail("asked for free memory"))
    IndexDir(gpu_index_dir).check_gpu_memory(shard=True, gpus=1)
