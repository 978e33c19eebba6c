"""Values every model that holds input shares: sane timestamps and storable, bounded text.

Whatever reaches a decision, the state table or a notification went through these: a timestamp carries a
time zone and lies between the epoch and 2100, text is valid Unicode that DynamoDB can store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)  # sam local generate-event and SDK fixtures use the epoch
LATEST = datetime(2100, 1, 1, tzinfo=UTC)
MAX_TEXT = 2048  # alarm names are <= 255; status messages and reasons are clipped, not rejected
LONE_SURROGATE = "text is not valid Unicode (lone surrogate)"


def _sane_time(value: datetime) -> datetime:
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"timestamp outside {EARLIEST:%Y}-{LATEST:%Y}")
    return value.astimezone(UTC)


def is_storable(value: str) -> bool:
    """Whether UTF-8 can carry the text: a Python str may hold a lone surrogate (a JSON or YAML escape
    such as \\uD800 makes one), which DynamoDB, JSON and Slack refuse."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _storable(value: str) -> str:
    if not is_storable(value):
        raise ValueError(LONE_SURROGATE)
    return value


def _bounded(value: str) -> str:
    return value[:MAX_TEXT]


Timestamp = Annotated[AwareDatetime, AfterValidator(_sane_time)]
Name = Annotated[str, AfterValidator(_storable)]  # stored exactly (names, ids, notification text): never clipped
Text = Annotated[str, AfterValidator(_storable), AfterValidator(_bounded)]  # free text: clipped
