"""Tiny Llama models built from a config with SmolLM2's tokenizer and chat template, saved to
disk, so tests and benchmarks load them through the real loading path (no hub access):
the ``tiny_lm_dir`` / ``tiny_reward_model_dir`` fixtures (tests/conftest.py) and
benchmarks/reward_model.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_tiny_llama(folder: Path, tokenizer_dir: Path | str, hidden: int = 32,
                    reward_head: bool = False) -> Path:
    """A 2-layer Llama, ``hidden`` wide (seeded: torch seed 0), with the tokenizer of
    ``tokenizer_dir``, saved to ``folder``: a causal LM, or with ``reward_head`` a sequence
    classifier with one output (a reward model)."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
    )

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    extra: dict[str, Any] = {"num_labels": 1} if reward_head else {}
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True, **extra)
    torch.manual_seed(0)
    model_class = LlamaForSequenceClassification if reward_head else LlamaForCausalLM
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
