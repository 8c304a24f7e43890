"""A ``tokenizer.json`` read from disk or a URL, parsed as untrusted data: what the tokenizers library
refuses (not JSON, not a tokenizer, not UTF-8) is one line naming the file and what to do, not an
internal error (the library raises a bare ``Exception``)."""

from __future__ import annotations

from tokenizers import Tokenizer

from glm_common.errors import GlmError


def parse_tokenizer(data: bytes | str, *, where: str, fix: str) -> Tokenizer:
    """``data`` (the file's bytes, already read with a size bound) as a Tokenizer; ``where`` names the
    file in the message, ``fix`` says what to do about it."""
    try:
        return Tokenizer.from_str(data.decode("utf-8") if isinstance(data, bytes) else data)
    except Exception as err:  # tokenizers' own Exception for bad JSON or fields; UnicodeDecodeError
        raise GlmError(f"{where} is not a tokenizer.json ({str(err).splitlines()[0][:200]}); {fix}") from None
