"""A byte-level BPE tokenizer in the Hugging Face layout, trained with ``tokenizers`` on local text.

Byte-level (GPT-2's alphabet of 256 byte symbols) so that any UTF-8 text, and any byte
sequence a sampler produces, round-trips; special tokens for documents and chat turns; and the
files a Hugging Face tokenizer folder holds: ``tokenizer.json``, ``tokenizer_config.json``
(with ``bos``/``eos``/``pad`` and the ``chat_template`` key) and ``chat_template.jinja``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from modelfleet.zoo.llm.genai_folder import CHAT_TEMPLATE, TOKENIZER_CONFIG, TOKENIZER_JSON

END_OF_TEXT, SYSTEM, USER, ASSISTANT, END_OF_TURN = (
    "<|endoftext|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
#: Ids 0 to 4, in this order: documents are separated by ``<|endoftext|>``; a chat turn is a
#: role token, a newline, the content and ``<|end|>``.
SPECIAL_TOKENS = (END_OF_TEXT, SYSTEM, USER, ASSISTANT, END_OF_TURN)
#: Hugging Face's convention: ``messages`` (``role`` system, user or assistant, and ``content``),
#: ``add_generation_prompt`` to open the assistant's turn. A role other than those three renders
#: nothing: the server that renders it refuses such a message before.
CHAT_TEMPLATE_TEXT = (
    "{% for message in messages %}"
    "{% if message['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (the special ones included) learnt from ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def tokenizer_config(context: int) -> dict[str, object]:
    """``tokenizer_config.json``: the special tokens, the context length and the chat template."""
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": END_OF_TEXT,
        # A chat turn ends with <|end|>; GenAI's config and the engine stop at <|endoftext|> too.
        "eos_token": END_OF_TURN,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE_TEXT,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path, context: int) -> Path:
    """Write the Hugging Face tokenizer folder into ``out_dir`` and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / TOKENIZER_JSON))
    config = json.dumps(tokenizer_config(context), indent=2, ensure_ascii=False)
    (out_dir / TOKENIZER_CONFIG).write_text(config + "\n", encoding="utf-8")
    (out_dir / CHAT_TEMPLATE).write_text(CHAT_TEMPLATE_TEXT, encoding="utf-8")
    return out_dir
