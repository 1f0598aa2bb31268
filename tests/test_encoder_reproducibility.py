"""The embedded encoder gives the same vectors on any x86-64 CPU: properties one machine can check (ONNX fp32
equals the torch reference, a vector depends on its text alone, torch held to AVX2 stays within the measured
spread), the int8 option's instruction set recorded and warned about, and old runs resolving as they ran."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from raypipe.core.config import dump_config, load_config
from raypipe.core.jobargs import legacy_run_overrides
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus, load_questions
from raypipe.retrieval import encoder_spec
from raypipe.retrieval import index as index_module
from raypipe.retrieval.encoders import EncoderSpec, int8_kernel_isa, passage_text
from raypipe.retrieval.index import IndexMismatchError, IndexSettings, check_encoder, expected_manifest
from raypipe.retrieval.shipped import ISA_SPREAD

FP32_TOLERANCE = 1e-5  # largest L2 distance between two fp32 computations of one unit vector (measured: 1e-6)


def bundled_texts(n: int) -> tuple[list[str], list[str]]:
    passages = [passage_text(p.title, p.text) for _, p in zip(range(n), iter_corpus(BUNDLED_CORPUS))]
    return passages, [q.question for q in load_questions("hotpotqa", n)]


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a.astype(np.float64) - b.astype(np.float64), axis=1)


def test_the_default_encoder_is_onnx_fp32_and_equals_the_torch_reference():
    spec = encoder_spec(load_config("embedded").retrieval)
    assert (spec.name, spec.resolved_backend, spec.resolved_quantization) == ("minilm", "onnx", "none")
    default, reference = spec.load(), EncoderSpec(backend="torch", device="cpu").load()
    passages, questions = bundled_texts(16)
    assert distances(default.encode_passages(passages), reference.encode_passages(passages)).max() < FP32_TOLERANCE
    assert distances(default.encode_queries(questions), reference.encode_queries(questions)).max() < FP32_TOLERANCE


def test_a_default_vector_is_a_function_of_its_text_alone():
    """One text per ONNX call: alone, reordered or among others, the same bits (a build's blocks, order and
    resumes cannot change its vectors)."""
    encoder = encoder_spec(load_config("embedded").retrieval).load()
    passages, _ = bundled_texts(6)
    together = encoder.encode_passages(passages)
    assert np.array_equal(encoder.encode_passages(passages[::-1])[::-1], together)
    assert np.array_equal(encoder.encode_passages(passages[2:3])[0], together[2])


@pytest.mark.slow
def test_torch_held_to_avx2_stays_within_the_measured_spread_between_instruction_sets(tmp_path):
    """torch, MKL and oneDNN capped at AVX2 (a no-op on an AVX2 CPU) against this CPU's ONNX fp32: within
    the spread the shipped-vector tolerance allows (benchmarks/encoder_spread.py measures it, ONNX
    Runtime under an emulated AVX2 CPU included)."""
    passages, questions = bundled_texts(8)
    out = tmp_path / "capped.npy"
    script = (
        "import sys, numpy as np; from raypipe.retrieval.encoders import EncoderSpec; "
        "e = EncoderSpec(backend='torch', device='cpu', threads=1).load(); "
        "np.save(sys.argv[1], np.concatenate([e.encode_passages(sys.argv[2].split('\\x1f')), "
        "e.encode_queries(sys.argv[3].split('\\x1f'))]))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    subprocess.run(
        [sys.executable, "-c", script, str(out), "\x1f".join(passages), "\x1f".join(questions)], env=env, check=True
    )
    encoder = EncoderSpec(threads=1).load()
    native = np.concatenate([encoder.encode_passages(passages), encoder.encode_queries(questions)])
    assert distances(np.load(out), native).max() < ISA_SPREAD


def test_int8_kernel_isa_reads_the_cpu_flags(tmp_path):
    def isa(flags: str) -> str:
        path = tmp_path / "cpuinfo"
        path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
        return int8_kernel_isa(path)

    assert isa("avx avx2 fma") == "avx2"  # e.g. AMD EPYC Rome/Milan: pmaddubsw, which saturates
    assert isa("avx2 avx512f avx512bw avx512_vnni avx512_bf16") == "avx512_vnni"  # this kind of machine
    assert isa("avx2 avx512f avx512bw") == "avx512bw"
    assert isa("avx2 avx_vnni") == "avx_vnni"
    assert isa("avx2 avx512bw avx512_vnni amx_tile amx_int8") == "amx_int8"
    assert isa("sse4_1") == "older"
    assert int8_kernel_isa(tmp_path / "absent") == "unknown"


def test_an_int8_index_records_its_kernels_and_warns_on_a_cpu_with_others(tmp_path, monkeypatch, caplog):
    int8, fp32 = EncoderSpec(quantization="int8"), EncoderSpec()
    manifest = expected_manifest(int8, IndexSettings(), tmp_path / "corpus.jsonl", "0" * 64)
    assert manifest["int8_isa"] == int8_kernel_isa()
    assert "int8_isa" not in expected_manifest(fp32, IndexSettings(), tmp_path / "corpus.jsonl", "0" * 64)
    with caplog.at_level(logging.WARNING):
        check_encoder(manifest, int8, tmp_path)
        assert not caplog.records  # built on this CPU
        other = "avx2" if manifest["int8_isa"] != "avx2" else "avx512_vnni"
        monkeypatch.setattr(index_module, "int8_kernel_isa", lambda: other)
        check_encoder(manifest, int8, tmp_path)
    assert "other int8 kernels than this CPU's" in caplog.text and "encoder_quantization=none" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_encoder({k: v for k, v in manifest.items() if k != "int8_isa"}, int8, tmp_path)  # built before the field
    assert "int8 kernels it does not record" in caplog.text
    with pytest.raises(IndexMismatchError, match="index has 'minilm-int8', configured 'minilm'"):
        check_encoder(manifest, fp32, tmp_path)  # fp32 queries never search an int8 index unasked


@pytest.mark.parametrize(
    ("quantization", "name"), [("none", "minilm"), ("int8", "minilm-int8"), ("auto", "minilm-int8")]
)
def test_a_run_keeps_the_encoder_it_ran_with(tmp_path, quantization, name):
    """Runs made while ``auto`` (int8 for minilm) was the default say so in their config.yaml and keep it."""
    path = tmp_path / "config.yaml"
    dump_config(load_config("embedded", [f"retrieval.encoder_quantization={quantization}"]), path)
    assert legacy_run_overrides(path) == []
    assert encoder_spec(load_config(str(path)).retrieval).name == name


def test_the_embedded_default_is_fp32_for_new_runs(tmp_path):
    path = tmp_path / "config.yaml"
    dump_config(load_config("embedded"), path)
    assert "encoder_quantization: none" in path.read_text()
    assert encoder_spec(load_config(str(path)).retrieval).name == "minilm"
