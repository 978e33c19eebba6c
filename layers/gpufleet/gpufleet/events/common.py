"""What every parser shares: lenient envelopes, sane timestamps and text, one-line rejections.

Lenient on what gpufleet does not read, strict on what it does: envelope models declare only the
fields a decision uses (others, placeholders like "EXAMPLE" included, are ignored), while the fields
read must be valid: timestamps carry a time zone and lie between 2000 and 2100, text is valid Unicode
that DynamoDB can store and has a bounded length.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, ValidationError

from gpufleet.domain.errors import InvalidEvent, describe_validation_error

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)  # sam local generate-event and SDK fixtures use the epoch
LATEST = datetime(2100, 1, 1, tzinfo=UTC)
MAX_TEXT = 2048  # alarm names are <= 255; status messages and reasons are clipped, not rejected


def _sane_time(value: datetime) -> datetime:
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"timestamp outside {EARLIEST:%Y}-{LATEST:%Y}")
    return value.astimezone(UTC)


def _storable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text is not valid Unicode (lone surrogate)") from None
    return value


def _bounded(value: str) -> str:
    return value[:MAX_TEXT]


Timestamp = Annotated[AwareDatetime, AfterValidator(_sane_time)]
Name = Annotated[str, AfterValidator(_storable)]  # a name we store and look up: must be exact
Text = Annotated[str, AfterValidator(_storable), AfterValidator(_bounded)]  # free text: clipped


class Lenient(BaseModel):
    """An envelope or detail model: declares what gpufleet reads, ignores everything else."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


def malformed(shape: str, err: ValidationError) -> InvalidEvent:
    """One line naming the fields that were wrong (at most three), never the event's body."""
    return InvalidEvent(f"{shape} event is malformed: " + "; ".join(describe_validation_error(err, limit=3)))


def validate(model: type[Lenient], data: Any, shape: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise malformed(shape, err) from None
    except RecursionError:
        raise InvalidEvent(f"{shape} event is nested too deeply") from None
