"""What every parser shares: lenient envelopes, sane timestamps and text, one-line rejections.

Lenient on what gpufleet does not read, strict on what it does: envelope models declare only the
fields a decision uses (others, placeholders like "EXAMPLE" included, are ignored), while the fields
read must be valid: timestamps carry a time zone and lie between 1970 and 2100, text is valid Unicode
that DynamoDB can store and has a bounded length.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.domain.errors import InvalidEvent, describe_validation_error
from gpufleet.domain.values import EARLIEST, LATEST, MAX_TEXT, Name, Text, Timestamp

__all__ = ["EARLIEST", "LATEST", "MAX_TEXT", "Lenient", "Name", "Text", "Timestamp", "malformed", "validate"]


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
