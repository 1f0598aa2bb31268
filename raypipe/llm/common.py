"""Request handling shared by every backend: context budget, stop strings, the local tokenizer, the
engine's record.

Context policy (all backends): ``max_tokens`` is clamped to what fits after the prompt
(``max_model_len - prompt_tokens``), so a long trajectory still gets its last, shorter turn and ends
with ``finish_reason="length"``; :class:`ContextOverflowError` is raised, before anything is
submitted, only when the prompt alone leaves no room for a single new token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raypipe.core.config import EngineConfig
from raypipe.llm.base import ContextOverflowError, Engine, EngineError, GenerationRequest


def resolve_dtype(dtype: str, on_cpu: bool) -> str:
    """The dtype an engine loads: ``auto`` on a CPU is bfloat16 only where the CPU computes it natively.

    Without AVX512-BF16 or AMX, torch emulates bfloat16 matrix products: about 40x slower than float32
    (measured on an AVX2 EPYC: 85 ms vs 2.2 ms for a 64x576 @ 576x1536 product, one thread), which
    turns minutes of generation into hours. ``auto`` on a GPU is the model's own dtype (vLLM's auto).
    """
    if dtype != "auto" or not on_cpu:
        return dtype
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux: assume emulation, the safe (fast) choice is float32
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def engine_record(
    engine: Engine,
    config: EngineConfig | None,
    model_path: Path | None = None,
    dtype: str | None = None,
    start_seconds: float = 0.0,
) -> dict[str, Any]:
    """The fields every engine's ``describe()`` starts with: its backend (the class name for an engine without
    a config), model and local path, the dtype it loaded (``auto`` resolved), context, regex support, start time."""
    return {
        "backend": config.backend if config else type(engine).__name__,
        "model": config.model if config else None,
        "model_path": str(model_path) if model_path else None,
        "dtype": dtype,
        "max_model_len": engine.max_model_len,
        "supports_regex": engine.supports_regex,
        "start_seconds": round(float(start_seconds), 2),
    }


def fit_max_tokens(prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """The number of new tokens to ask for: ``max_tokens`` clamped to the room left in the context."""
    if max_tokens < 1:
        raise EngineError(f"max_tokens must be at least 1, got {max_tokens}")
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ContextOverflowError(
            f"prompt of {prompt_tokens} tokens leaves no room in a context of {max_model_len} tokens"
        )
    return min(max_tokens, room)


def check_request(request: GenerationRequest) -> None:
    """Reject values no backend can honour, with a message naming the field."""
    if request.temperature < 0:
        raise EngineError(f"temperature must be >= 0, got {request.temperature}")
    if not 0 < request.top_p <= 1:
        raise EngineError(f"top_p must be in (0, 1], got {request.top_p}")
    if any(not s for s in request.stop):
        raise EngineError("stop strings must be non-empty")


def tokenized_request(
    tokenizer: LocalTokenizer, request: GenerationRequest, max_model_len: int
) -> tuple[list[int], int]:
    """A checked request's prompt token ids and the number of new tokens to ask for (the context policy above)."""
    check_request(request)
    prompt_ids = tokenizer.encode(request.prompt)
    return prompt_ids, fit_max_tokens(len(prompt_ids), request.max_tokens, max_model_len)


def find_stop(text: str, stops: tuple[str, ...], new_chars: int) -> tuple[int, str] | None:
    """The stop string that ends ``text`` now, checking only where the last ``new_chars`` characters could
    complete one (so the first occurrence wins when called after every token). Returns (index, stop).

    Mirrors vLLM's check: stops are tried in the order given and the first one found wins.
    """
    for stop in stops:
        start = max(0, len(text) - new_chars - len(stop) + 1)
        index = text.find(stop, start)
        if index != -1:
            return index, stop
    return None


class LocalTokenizer:
    """A Hugging Face tokenizer loaded from a model folder: chat template and token counts.

    Prompt tokens are counted exactly as the backends tokenize prompts (the tokenizer's own special
    tokens, no extra BOS), so ``count_tokens(prompt)`` equals ``Generation.prompt_tokens``.
    """

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        # transformers annotates decode's return for batches too; one sequence decodes to a str
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)  # type: ignore[return-value]

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.tokenizer.chat_template:
            raise EngineError(f"the tokenizer in {self.path} has no chat template")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return text  # type: ignore[return-value]  # tokenize=False returns a str; transformers annotates every kind
