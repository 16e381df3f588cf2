"""Chat templates rendered as Hugging Face does, in Jinja2's sandbox; text streamed whole characters at a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edge_node.generation import ChatTemplateError, Tokenizer
from edge_node.generation.detok import TextStream

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def _folder_with(tmp_path: Path, tiny_model: Path, template: str | None, *, in_config: bool = False) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(tiny_model / "tokenizer.json", folder)
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    if template is not None and in_config:
        config["chat_template"] = template
    elif template is not None:
        (folder / "chat_template.jinja").write_text(template)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_the_builders_chat_template_renders_the_chat(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_folder(tiny_model)
    assert tokenizer.render_chat(CHAT) == "<|system|>Be brief.<|user|>Hi<|assistant|>"
    assert tokenizer.render_chat(CHAT, add_generation_prompt=False) == "<|system|>Be brief.<|user|>Hi"
    ids = tokenizer.encode(tokenizer.render_chat(CHAT), add_special_tokens=False)
    assert tokenizer.token_id("<|assistant|>") == ids[-1]


def test_a_template_in_tokenizer_config_gets_hf_variables(tmp_path: Path, tiny_model: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('bad role') }}{% endif %}[{{ m['role'] | upper }}] {{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
    )
    tokenizer = Tokenizer.from_folder(_folder_with(tmp_path, tiny_model, template, in_config=True))
    assert tokenizer.render_chat(CHAT) == (
        "<|endoftext|>[SYSTEM] Be brief.<|endoftext|>\n[USER] Hi<|endoftext|>\n[ASSISTANT]"
    )
    with pytest.raises(ChatTemplateError, match="bad role") as refused:
        tokenizer.render_chat([{"role": "tool", "content": "x"}])
    assert refused.value.status == 400


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
        "{{ cycler.__init__.__globals__.os.system('true') }}",
    ],
)
def test_an_unsafe_template_is_refused_by_the_sandbox(tmp_path: Path, tiny_model: Path, template: str) -> None:
    tokenizer = Tokenizer.from_folder(_folder_with(tmp_path, tiny_model, template))
    with pytest.raises(ChatTemplateError) as refused:
        tokenizer.render_chat(CHAT)
    assert refused.value.status == 400


def test_a_message_with_an_unknown_role_or_no_messages_is_refused(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_folder(tiny_model)
    with pytest.raises(ChatTemplateError, match="role 'wizard'"):
        tokenizer.render_chat([{"role": "wizard", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="empty"):
        tokenizer.render_chat([])


def test_text_is_released_in_whole_characters(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_folder(tiny_model)
    text = "naïve café → 日本語 🙂 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text) // 2  # the tiny vocabulary splits multi-byte characters into byte tokens
    stream = TextStream(tokenizer.decode, stop=())
    deltas = [stream.add(t) for t in ids] + [stream.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_text_that_may_start_a_stop_string_is_held_back(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_folder(tiny_model)
    stream = TextStream(tokenizer.decode, stop=("END!",))
    deltas = [stream.add(t) for t in tokenizer.encode("abc EN then END! more", add_special_tokens=False)]
    assert "".join(deltas) == "abc EN then "
    assert stream.stopped
    assert all("E" not in d or d.endswith("then ") or "EN" in d for d in deltas)
