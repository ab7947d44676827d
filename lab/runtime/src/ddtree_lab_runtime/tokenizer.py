"""A byte-level tokenizer: 256 byte tokens in GPT-2's byte order, plus three special tokens.

Token ids 0..255 are the bytes in the order of GPT-2's ``bytes_to_unicode`` table (the printable
bytes first), as in the byte-level BPE vocabularies of Llama-3 / Qwen: id 0 is ``"!"``. That is why
an all-zero logit row (argmax -> id 0) reads ``!!!!!!!!``, the symptom of the DDTree incident.

Specials: 256 ``<|endoftext|>`` (EOS), 257 ``<|im_start|>``, 258 ``<|im_end|>`` (end of turn,
also a stop token). The chat template is ChatML (Qwen's).
"""

from __future__ import annotations

import codecs
import re
from typing import Iterable, Sequence


def _byte_order() -> list[int]:
    order = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    order += [b for b in range(256) if b not in order]
    return order


BYTE_OF_ID: list[int] = _byte_order()  # token id -> byte value
ID_OF_BYTE: list[int] = [0] * 256  # byte value -> token id
for _tid, _byte in enumerate(BYTE_OF_ID):
    ID_OF_BYTE[_byte] = _tid

NUM_BYTE_TOKENS = 256
EOS_ID = 256
IM_START_ID = 257
IM_END_ID = 258
SPECIALS = {"<|endoftext|>": EOS_ID, "<|im_start|>": IM_START_ID, "<|im_end|>": IM_END_ID}
SPECIAL_TEXT = {v: k for k, v in SPECIALS.items()}
VOCAB_SIZE = 259
STOP_TOKEN_IDS = frozenset({EOS_ID, IM_END_ID})

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class ByteTokenizer:
    vocab_size = VOCAB_SIZE
    eos_token_id = EOS_ID
    stop_token_ids = STOP_TOKEN_IDS

    def encode(self, text: str) -> list[int]:
        """Text -> ids. Special-token strings in the text become their ids (as HF tokenizers do)."""
        ids: list[int] = []
        for piece in _SPECIAL_RE.split(text):
            if not piece:
                continue
            special = SPECIALS.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(ID_OF_BYTE[b] for b in piece.encode("utf-8"))
        return ids

    @staticmethod
    def to_bytes(ids: Iterable[int], skip_special_tokens: bool = True) -> bytes:
        out = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < NUM_BYTE_TOKENS:
                out.append(BYTE_OF_ID[i])
            elif not skip_special_tokens and i in SPECIAL_TEXT:
                out.extend(SPECIAL_TEXT[i].encode())
        return bytes(out)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.to_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then the assistant turn."""
        parts = []
        for message in messages:
            parts.append(
                f"<|im_start|>{message.get('role', 'user')}\n{_content_text(message.get('content'))}<|im_end|>\n"
            )
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content)


class IncrementalDecoder:
    """Bytes -> text as tokens arrive; a multi-byte UTF-8 character is emitted once complete."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        return self._decoder.decode(ByteTokenizer.to_bytes(ids))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
