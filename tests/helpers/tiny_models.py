"""One-layer BERTs with MiniLM's vocabulary: the training code paths at a fraction of the cost."""

from __future__ import annotations

from pathlib import Path


def tiny_bert(folder: Path) -> str:
    """Save the tiny model (a regression head, num_labels=1) and MiniLM's tokenizer to ``folder``."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from raypipe.core.models import resolve_sentence_model

    tok = AutoTokenizer.from_pretrained(str(resolve_sentence_model("minilm")))
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def tiny_encoder(folder: Path) -> Path:
    """Save a tiny encoder (no head, seeded weights, 128 positions) and MiniLM's tokenizer to ``folder``:
    the Stop-RAG Q-network's base."""
    import torch
    from transformers import BertConfig, BertModel

    from raypipe.core.models import resolve_sentence_model
    from raypipe.stoprag.qnet import load_tokenizer

    tokenizer = load_tokenizer(resolve_sentence_model("minilm"))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_llama(folder: Path) -> Path:
    """Save a two-layer Llama (seeded weights) with the embedded agent's tokenizer (SmolLM2's) to ``folder``:
    the agent fine-tuning's code paths at a fraction of the cost."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from raypipe.core.models import resolve_llm

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_llm("smollm2")))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.5,  # logits that can move
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
