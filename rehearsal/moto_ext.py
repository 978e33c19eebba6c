"""moto server plus one EMULATION: injectable Auto Scaling scaling activities.

moto never fails a launch and its DescribeScalingActivities always answers an empty list. The test
harness and the rehearsal inject failed launch activities here (clearly emulated), and the code under
test reads them back through the normal DescribeScalingActivities API over HTTP:

    POST /_gpufleet/emulation/scaling-activities   JSON list of activities (botocore shape, times ISO 8601)
    DELETE /_gpufleet/emulation/scaling-activities
    POST /_gpufleet/emulation/lifecycle            {"group", "instance_ids", "state"}: e.g. "Pending" for
                                                   instances EC2 could not deliver (moto has them InService)
    POST /_gpufleet/emulation/capacity-reservations JSON list of {"CapacityReservationId", "EndDate" (ISO
                                                   8601), "State", "ReservationType", "InstanceType"}:
                                                   what EC2 DescribeCapacityReservations answers (moto has
                                                   no such API)

A guard for a moto blind spot: moto server is threaded and its DynamoDB checks a ConditionExpression
and writes without a lock, so two concurrent conditional writes to one item can both succeed - which
DynamoDB never allows (it serialises writes to an item). gpufleet's lease depends on that guarantee;
`_serialise_dynamodb_writes` restores it (found when a concurrency test saw two invocations both take the
same group's lease on a loaded machine).

Not an emulation, a speed-up: moto's ListMetrics compares every stored datum against every series
already found before it looks at the requested dimensions (quadratic: 10-20 s per call after an hour of
the demo's metrics). `_cheap_tests_first` applies the same tests in the other order; the answer is the
same.

An EMULATION for a simulated clock: CloudWatch Logs accepts events from 14 days back to 2 hours ahead
of its own clock (moto too). The rehearsal's clock is fixed on 2026-11-23, so with
GPUFLEET_MOTO_LOGS_NOW=ISO-8601 set, moto's Logs backend takes that instant as "now" (`_logs_clock`);
without it nothing changes.

EMULATED: SageMaker HyperPod's UpdateCluster and BatchDeleteClusterNodes (moto has neither), and the
node states moto never shows (rehearsal.moto_hyperpod says what is emulated and what stays hidden):

    POST /_gpufleet/emulation/hyperpod-node-status {"cluster", "node_ids", "status"}: e.g. "Failure",
                                                   "DeepHealthCheckInProgress" (moto has every node Running)

Run as `python -m rehearsal.moto_ext -H 127.0.0.1 -p PORT` (same arguments as moto.server).
"""

from __future__ import annotations

import io
import json
import sys
import threading
import urllib.parse
from datetime import datetime
from typing import Any

from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult

from rehearsal import moto_hyperpod

INJECT_PATH = "/_gpufleet/emulation/scaling-activities"
LIFECYCLE_PATH = "/_gpufleet/emulation/lifecycle"
RESERVATIONS_PATH = "/_gpufleet/emulation/capacity-reservations"
_reservations: list[dict[str, Any]] = []
_activities: list[dict[str, Any]] = []
_lock = threading.Lock()


def _describe_scaling_activities(self: AutoScalingResponse) -> ActionResult:
    group = self._get_param("AutoScalingGroupName")
    ids = self._get_param("ActivityIds", [])
    max_records = int(self._get_param("MaxRecords", 100))
    start = int(self._get_param("NextToken", 0) or 0)
    with _lock:
        matching = [
            a
            for a in _activities
            if (not group or a["AutoScalingGroupName"] == group) and (not ids or a["ActivityId"] in ids)
        ]
    matching.sort(key=lambda a: a["StartTime"], reverse=True)  # newest first, as AWS answers
    page = [
        {**a, "StartTime": datetime.fromisoformat(a["StartTime"]), "EndTime": datetime.fromisoformat(a["EndTime"])}
        for a in matching[start : start + max_records]
    ]
    result: dict[str, Any] = {"Activities": page}
    if start + max_records < len(matching):
        result["NextToken"] = str(start + max_records)
    return ActionResult(result)


def _set_lifecycle(group: str, instance_ids: list[str], state: str) -> int:
    from moto.autoscaling.models import autoscaling_backends

    changed = 0
    for _, _, backend in autoscaling_backends.iter_backends():
        asg = backend.autoscaling_groups.get(group)  # type: ignore[attr-defined]
        for instance_state in asg.instance_states if asg else []:
            if instance_state.instance.id in instance_ids:
                instance_state.lifecycle_state = state
                changed += 1
    return changed


def _reservations_xml(body: bytes) -> bytes:
    """EC2's query-protocol answer to DescribeCapacityReservations, from what was injected."""
    params = urllib.parse.parse_qs(body.decode())
    wanted = {v[0] for k, v in params.items() if k.startswith("CapacityReservationId.")}
    with _lock:
        found = [r for r in _reservations if not wanted or r["CapacityReservationId"] in wanted]
    items = "".join(
        "<item>"
        f"<capacityReservationId>{r['CapacityReservationId']}</capacityReservationId>"
        f"<endDate>{r['EndDate']}</endDate><state>{r.get('State', 'active')}</state>"
        f"<reservationType>{r.get('ReservationType', 'capacity-block')}</reservationType>"
        f"<instanceType>{r.get('InstanceType', 'p5.48xlarge')}</instanceType>"
        "</item>"
        for r in found
    )
    return (
        '<DescribeCapacityReservationsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>gpufleet-emulation</requestId><capacityReservationSet>{items}</capacityReservationSet>"
        "</DescribeCapacityReservationsResponse>"
    ).encode()


def _is_ec2(environ: dict[str, Any]) -> bool:
    return environ.get("REQUEST_METHOD") == "POST" and "/ec2/aws4_request" in environ.get("HTTP_AUTHORIZATION", "")


def _with_injection(app: Any) -> Any:
    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == RESERVATIONS_PATH:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            with _lock:
                if environ.get("REQUEST_METHOD") == "POST":
                    _reservations.extend(json.loads(environ["wsgi.input"].read(length) or b"[]"))
                else:
                    _reservations.clear()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [b"{}"]
        if _is_ec2(environ):  # peek: only DescribeCapacityReservations is answered here
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            if b"Action=DescribeCapacityReservations" in body:
                start_response("200 OK", [("Content-Type", "text/xml")])
                return [_reservations_xml(body)]
            environ["wsgi.input"] = io.BytesIO(body)
        if environ.get("PATH_INFO") == LIFECYCLE_PATH and environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"{}")
            changed = _set_lifecycle(body["group"], body["instance_ids"], body["state"])
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"changed": changed}).encode()]
        if environ.get("PATH_INFO") == moto_hyperpod.NODE_STATUS_PATH and environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"{}")
            changed = moto_hyperpod.set_node_status(body["cluster"], body["node_ids"], body["status"])
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"changed": changed}).encode()]
        if environ.get("PATH_INFO") == INJECT_PATH:
            method = environ.get("REQUEST_METHOD")
            with _lock:
                if method == "POST":
                    length = int(environ.get("CONTENT_LENGTH") or 0)
                    _activities.extend(json.loads(environ["wsgi.input"].read(length) or b"[]"))
                elif method == "DELETE":
                    _activities.clear()
                count = len(_activities)
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"activities": count}).encode()]
        if environ.get("PATH_INFO") == "/moto-api/reset":
            with _lock:
                _activities.clear()
                _reservations.clear()
        return app(environ, start_response)

    return wsgi


def _serialise_dynamodb_writes() -> None:
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()
    for name in ("put_item", "update_item", "delete_item", "transact_write_items"):
        original = getattr(DynamoDBBackend, name)

        def serialised(self: DynamoDBBackend, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with lock:
                return _original(self, *args, **kwargs)

        setattr(DynamoDBBackend, name, serialised)


def _speed_up_list_metrics() -> None:
    from moto.cloudwatch.models import Dimension, MetricDatumBase

    moto_filter = MetricDatumBase.filter

    def _cheap_tests_first(
        self: MetricDatumBase,
        namespace: str | None,
        name: str | None,
        dimensions: list[dict[str, str]],
        already_present_metrics: list[MetricDatumBase] | None = None,
    ) -> bool:
        if dimensions and any(Dimension(d["Name"], d.get("Value")) not in self.dimensions for d in dimensions):
            return False
        return moto_filter(self, namespace, name, [], already_present_metrics)

    MetricDatumBase.filter = _cheap_tests_first  # type: ignore[method-assign]


ENV_LOGS_NOW = "GPUFLEET_MOTO_LOGS_NOW"


def _logs_clock() -> None:
    import os

    import moto.logs.models as logs_models

    when = os.environ.get(ENV_LOGS_NOW)
    if when:
        fixed = datetime.fromisoformat(when.replace("Z", "+00:00")).replace(tzinfo=None)
        logs_models.utcnow = lambda: fixed  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    import moto.server
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    AutoScalingResponse.describe_scaling_activities = _describe_scaling_activities  # type: ignore[method-assign]
    moto_hyperpod.install()
    _speed_up_list_metrics()
    _serialise_dynamodb_writes()
    _logs_clock()
    original = DomainDispatcherApplication.__call__

    def dispatch(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
        return _with_injection(lambda e, s: original(self, e, s))(environ, start_response)

    DomainDispatcherApplication.__call__ = dispatch  # type: ignore[method-assign]
    moto.server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
