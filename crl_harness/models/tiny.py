"""A tiny random Llama with a locally trained tokenizer, for fast tests of the whole pipeline.

Holds ``build_tiny_model``. The tokenizer is a byte-level BPE trained here (so any text
encodes), wrapped in ``PreTrainedTokenizerFast`` with a ChatML chat template whose end-of-turn
token is the EOS, like SmolLM2's. The model is random: it exercises shapes, masks and log-probs,
never behaviour.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["build_tiny_model", "CHAT_TEMPLATE"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "<think>The goal is to the east, so I move east.</think><answer>east</answer>",
    "<think>I see a key; pick it up.</think><answer>pick up key</answer>",
    "You are an agent in a grid world. Valid actions: north, south, east, west, up, down, left, right.",
    "Invalid action: the answer must be <think>...</think><answer>ACTION</answer>.",
    "search[red shoes] click[buy now] go to fridge 1, take apple 1 from countertop 2",
    "The quick brown fox jumps over the lazy dog. 0123456789 @ # . | - + < > ` ~ { } [ ]",
]


def build_tiny_model(directory: str | os.PathLike, *, vocab_size: int = 384, hidden_size: int = 128,
                     num_layers: int = 2, seed: int = 0) -> Path:
    """Write (once) a tiny random ``LlamaForCausalLM`` and its tokenizer to ``directory``.

    Returns the directory, loadable with ``from_pretrained`` or ``HFBackend``. Calling it again
    on a directory that already holds the model does nothing.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        _CORPUS * 4,
        trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                            show_progress=False),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        # head_dim 64: vLLM's CPU attention kernels take only the usual head sizes.
        num_attention_heads=hidden_size // 64, num_key_value_heads=1,
        max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    # Written under a temporary name and renamed last, so an interrupted build is never mistaken
    # for a finished one.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=directory.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
    os.replace(staging, directory)
    return directory
