"""Tokenizers of the native engine: a byte-level one and a thin wrapper over a HuggingFace tokenizer.

Which one a model folder gets (`tokenizer_kind`): its HuggingFace tokenizer when it has tokenizer
files (TOKENIZER_FILES); the byte-level one when it declares it (BYTE_MARKER, a JSON file
`{"tokenizer": "byte"}`, as the trained tiny models in assets/ do) or when the caller asks for it
(`--tokenizer byte`). A folder with neither is refused by the server's launcher (a `--model-path:`
error), never served with a tokenizer it was not trained with. The built-in model is byte-level.
"""

from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
BYTE_MARKER = "replayssm_tokenizer.json"   # {"tokenizer": "byte"}: the folder's model is byte-level
TOKENIZERS = ("auto", "byte")              # --tokenizer: the folder's own (auto) or the byte-level one


def tokenizer_kind(model_path: str | None) -> str | None:
    """Which tokenizer a model folder has: "hf", "byte", or None (it says nothing about one)."""
    if not model_path:
        return "byte"
    folder = Path(model_path)
    if any((folder / f).exists() for f in TOKENIZER_FILES):
        return "hf"
    try:
        if json.loads((folder / BYTE_MARKER).read_text()).get("tokenizer") == "byte":
            return "byte"
    except (OSError, ValueError, AttributeError):
        pass
    return None


class ByteTokenizer:
    """Token i < 256 is byte i; 256 is BOS, 257 is EOS. Needs a vocabulary of at least 258."""

    BOS, EOS = 256, 257
    name = "bytes"

    def __init__(self, vocab_size: int = 258):
        if vocab_size < 258:
            raise ValueError(f"a byte-level tokenizer needs vocab_size >= 258, the model has {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_ids = {self.EOS}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.BOS] * add_special_tokens + list(text.encode("utf-8"))

    def count(self, text: str) -> int:
        """len(encode(text)), without building the ids."""
        return 1 + len(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_entry(self, t: int) -> dict:
        """What a logprobs entry shows of token t: its text and its bytes."""
        return {"token": self.decode([t]), "bytes": [t] if t < 256 else []}

    def chat_prompt(self, messages: list[dict], continue_final: bool = False) -> list[int]:
        """The conversation as a prompt; ``continue_final`` leaves the last (assistant) message open so
        that generation continues it (OpenAI/SGLang ``continue_final_message``)."""
        if continue_final:
            head = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages[:-1])
            return self.encode(head + f"<|{messages[-1]['role']}|>\n{messages[-1]['content']}")
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
        return self.encode(text)


class HFTokenizer:
    """A `transformers` tokenizer loaded from the model folder (imported lazily)."""

    name = "hf"

    def __init__(self, path: str):
        try:
            from transformers import AutoTokenizer
        except ImportError as e:   # a base dependency (pyproject.toml), but an install can lack it
            raise RuntimeError(f"the tokenizer of {path} needs the `transformers` package, which is not "
                               f"installed ({e}): pip install 'transformers>=5.0'") from None

        self.tok = AutoTokenizer.from_pretrained(path)
        self.vocab_size = len(self.tok)
        self.eos_ids = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_entry(self, t: int) -> dict:
        text = self.decode([t])
        return {"token": text, "bytes": list(text.encode("utf-8"))}

    def chat_prompt(self, messages: list[dict], continue_final: bool = False) -> list[int]:
        if getattr(self.tok, "chat_template", None):
            text = self.tok.apply_chat_template(messages, add_generation_prompt=not continue_final,
                                                continue_final_message=continue_final, tokenize=False)
            return self.tok.encode(text, add_special_tokens=False)
        if continue_final:
            head = "".join(f"{m['role']}: {m['content']}\n" for m in messages[:-1])
            return self.encode(head + f"{messages[-1]['role']}:{messages[-1]['content']}")
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return self.encode(text)


def load_tokenizer(model_path: str | None, vocab_size: int, eos_ids=(), mode: str = "auto"):
    """mode "auto": the HF tokenizer when the folder has tokenizer files, else the byte-level one
    (the launcher refuses a folder without either before it gets here); "byte": the byte-level one."""
    if mode not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {mode!r}")
    if mode == "auto" and tokenizer_kind(model_path) == "hf":
        tok = HFTokenizer(model_path)
    else:
        tok = ByteTokenizer(vocab_size)
    tok.eos_ids = set(tok.eos_ids) | {int(e) for e in eos_ids if e is not None and int(e) < vocab_size}
    return tok
