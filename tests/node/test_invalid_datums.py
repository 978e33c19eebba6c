"""A datum botocore refuses before sending (ParamValidationError): sending it again can never succeed, so
it is dropped alone, said once, counted, and the datums beside it and the windows behind it still go.
The refusals are botocore's own, from the real CloudWatch model. Python >= 3.9."""

import logging
import random
from datetime import datetime, timedelta, timezone

import pytest
from botocore.exceptions import ParamValidationError
from botocore.stub import Stubber

from fakes import FakeCloudWatch, client_error
from gpufleet_node.sender import Sender, cloudwatch_client, rejected

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)


def datum(at, value, group="train"):
    return {
        "MetricName": "GPUUtilization",
        "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group}],
        "Timestamp": at,
        "Value": value,
    }


def window(minute, bad=False):
    at = T0 + timedelta(minutes=minute)
    datums = [datum(at, float(i)) for i in range(4)]
    if bad:
        datums.insert(2, datum(at, 99.0, group=""))  # an empty dimension value: botocore's min length is 1
    return at, datums


def test_an_invalid_datum_is_dropped_alone_and_never_blocks_the_windows_behind_it(caplog):
    cw = FakeCloudWatch(validate=True)
    sender = Sender(cw, rng=random.Random(1))
    with caplog.at_level(logging.INFO, logger="gpufleet.publisher"):
        for minute in range(10):
            sender.enqueue(*window(minute, bad=minute == 1))
            sender.flush(T0 + timedelta(minutes=minute, seconds=1))
    sent = cw.datums()
    assert len(sent) == 40 and all(d["Dimensions"][0]["Value"] == "train" for d in sent)
    assert sorted({d["Timestamp"] for d in sent}) == [T0 + timedelta(minutes=m) for m in range(10)]
    assert sender.rejected_datums == 1 and sender.failures == 0 and sender.next_attempt is None
    assert not sender.buffer and cw.invalid_calls == 1  # refused once, never retried
    assert caplog.text.count("refused") == 1
    assert "1 of the 5 datums of 2026-11-23T08:01:00+00:00" in caplog.text
    assert "Invalid length for parameter MetricData[0].Dimensions[0].Value" in caplog.text
    assert "next try in" not in caplog.text  # no backoff: nothing transient happened


def test_in_a_backlog_only_the_invalid_datum_is_lost():
    cw = FakeCloudWatch(fail_next=3, validate=True)  # an outage first: the bad window waits in a batch
    sender = Sender(cw, rng=random.Random(2))
    for minute in range(10):
        sender.enqueue(*window(minute, bad=minute in (2, 5)))
        sender.flush(T0 + timedelta(minutes=minute, seconds=1))
    sender.flush(T0 + timedelta(hours=1))
    assert len(cw.datums()) == 40 and sender.rejected_datums == 2 and not sender.buffer


def test_a_real_boto3_client_sends_the_valid_datums_of_a_window_botocore_refuses(caplog, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # never the instance role: nothing leaves this host
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client = cloudwatch_client("us-east-1")  # the publisher's own client; the Stubber answers for AWS
    built, sent = [], []  # every call's parameters; those of the calls that got past botocore's checks
    client.meta.events.register(
        "before-parameter-build.cloudwatch.PutMetricData", lambda params, **_: built.append(params)
    )
    client.meta.events.register_first("before-call.*.*", lambda **_: sent.append(built[-1]))  # before the Stubber
    first, second = window(0, bad=True), window(1)
    with Stubber(client) as stub:
        stub.add_response("put_metric_data", {})
        stub.add_response("put_metric_data", {})
        sender = Sender(client)
        with caplog.at_level(logging.ERROR, logger="gpufleet.publisher"):
            sender.submit(*first, now=T0 + timedelta(minutes=1))
            sender.submit(*second, now=T0 + timedelta(minutes=2))
        stub.assert_no_pending_responses()
    good = [d for d in first[1] if d["Dimensions"][0]["Value"]]
    assert len(built) == 3  # the refused call, then the two windows
    assert [call["MetricData"] for call in sent] == [good, second[1]]
    assert sender.rejected_datums == 1 and sender.failures == 0 and not sender.buffer
    assert "ParamValidationError" in caplog.text


@pytest.mark.parametrize(
    ("error", "permanent"),
    [
        (ParamValidationError(report="Invalid length for parameter MetricData[0].Dimensions[0].Value"), True),
        (client_error("InvalidParameterValue", 400), True),
        (client_error("InvalidParameterCombination", 400), True),
        (client_error("Throttling", 400), False),
        (ConnectionError("Could not connect to the endpoint URL"), False),
    ],
)
def test_which_errors_are_permanent(error, permanent):
    assert rejected(error) is permanent
