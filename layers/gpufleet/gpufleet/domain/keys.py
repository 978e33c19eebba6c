"""Keys built from outside text, bounded so DynamoDB always accepts them.

A group name, an alarm ARN or a schedule's execution id can be hundreds of four-byte characters, while
DynamoDB refuses a sort key over 1,024 bytes (a partition key over 2,048). One refused key used to stop
every later write that carried it. Text that fits is kept as is; longer text keeps a readable prefix and
ends in a digest of the whole, so the key stays stable and distinct inputs stay distinct.
"""

from __future__ import annotations

import hashlib

MAX_SORT_KEY_BYTES = 1024  # DynamoDB's limit for a sort key (a partition key may have 2,048)
MAX_KEY_BYTES = MAX_SORT_KEY_BYTES  # every key gpufleet builds keeps under the smaller of the two
DIGEST_MARK = "~h:"  # what a shortened key ends with: the mark and 40 hex digits of SHA-256
_DIGEST_CHARS = 40


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _prefix_within(text: str, budget: int) -> str:
    """The longest prefix of whole characters that fits `budget` bytes."""
    raw = text.encode("utf-8", "surrogatepass")[:budget]
    return raw.decode("utf-8", "ignore") if budget > 0 else ""


def bounded(text: str, max_bytes: int = MAX_KEY_BYTES) -> str:
    """`text` if it fits `max_bytes` in UTF-8, else a readable prefix + DIGEST_MARK + its digest.

    Text that already ends like a shortened key is shortened too, so a short input can never equal
    another input's shortened form."""
    tail_len = len(DIGEST_MARK) + _DIGEST_CHARS
    if max_bytes <= tail_len:
        raise ValueError(f"max_bytes must exceed {tail_len}")
    looks_shortened = DIGEST_MARK in text[-tail_len:]
    if utf8_len(text) <= max_bytes and not looks_shortened:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    return _prefix_within(text, max_bytes - tail_len) + DIGEST_MARK + digest


def joined(prefix: str, *parts: str, max_bytes: int = MAX_KEY_BYTES) -> str:
    """`prefix` followed by the parts joined with '#', bounded as a whole (the prefix always kept)."""
    return prefix + bounded("#".join(parts), max_bytes - utf8_len(prefix))
