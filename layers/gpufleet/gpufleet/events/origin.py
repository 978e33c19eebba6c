"""Where an event says it comes from: the AWS account and region of its envelope and of the ARNs it names.

A function acts only on its own account and region. An alarm of another account, or an SNS topic of
another region, is refused in one line before anything is read, even when a policy mapping would
resolve its name to a group here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from gpufleet.domain.errors import InvalidEvent
from gpufleet.domain.models import Frozen

_ACCOUNT_KEYS = ("account", "accountId", "AWSAccountId")
# An SNS topic's ARN is not an origin: alarms may notify a topic in a central account or region, and the
# scaler reads the alarm back from its own account anyway. The alarm's ARN and account are.
_ARN_KEYS = ("alarmArn", "AlarmArn", "eventSourceARN")


class Origin(Frozen):
    """An account and a region; None where the event does not say."""

    account: str | None = None
    region: str | None = None

    def __str__(self) -> str:
        return f"account {(self.account or '?')[:40]!s} in {(self.region or '?')[:40]!s}"


def arn_origin(arn: Any) -> Origin | None:
    """arn:partition:service:region:account:resource; None for anything else."""
    if not isinstance(arn, str) or not arn.startswith("arn:"):
        return None
    parts = arn.split(":", 5)
    if len(parts) < 6:
        return None
    return Origin(account=parts[4] or None, region=parts[3] or None)


def _own(doc: dict[str, Any]) -> Iterator[Origin]:
    """The origins a document states itself: its account/region fields and the ARNs it names."""
    account = next((doc[k] for k in _ACCOUNT_KEYS if isinstance(doc.get(k), str) and doc[k]), None)
    region = doc.get("region") or doc.get("awsRegion")
    if account or isinstance(region, str):
        yield Origin(account=account, region=region if isinstance(region, str) else None)
    for key in _ARN_KEYS:
        found = arn_origin(doc.get(key))
        if found is not None:
            yield found
    resources = doc.get("resources")
    if isinstance(resources, list):
        yield from (o for o in map(arn_origin, resources) if o is not None)


def origins_of(event: dict[str, Any]) -> list[Origin]:
    """Every origin an event states: the envelope, each record, and an SNS record's alarm message."""
    found = list(_own(event))
    for record in event.get("Records") or ():
        if not isinstance(record, dict):
            continue
        found += _own(record)
        sns = record.get("Sns")
        if isinstance(sns, dict):
            found += _own(sns)
            try:
                message = json.loads(sns.get("Message") or "null")
            except (ValueError, TypeError, RecursionError):
                message = None
            if isinstance(message, dict):
                found += _own(message)
    return found


def check_origin(event: dict[str, Any], home: Origin) -> None:
    """Raise InvalidEvent when the event names an account or region other than the function's own."""
    for origin in origins_of(event):
        other_account = home.account and origin.account and origin.account != home.account
        other_region = home.region and origin.region and origin.region != home.region
        if other_account or other_region:
            raise InvalidEvent(f"event from {origin} but this function serves {home}: nothing done")
