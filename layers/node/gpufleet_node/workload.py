"""Whose work a GPU process is: a Kubernetes pod's container, a Slurm job, a systemd unit, or a user.

The model only; reading it off /proc and the kubelet lives in attribution.py and podresources.py.
Python >= 3.9.
"""

from typing import Any, Dict, Optional

from gpufleet_node.schema import TEAM_UNKNOWN

POD = "pod"
SLURM = "slurm"
UNIT = "unit"
USER = "user"
UNKNOWN = "unknown"
KINDS = (POD, SLURM, UNIT, USER, UNKNOWN)
RECORDED = ("namespace", "pod", "container", "pod_uid", "job_id", "unit", "user", "account", "partition")
# (container_id: too long; account and partition: a Slurm job's, from squeue, see slurm_jobs.py)


class Workload:
    """One workload identity. `key` is stable and unique on the node (what usage is summed by);
    `team` is who pays: the namespace of a pod, else the user (Slurm, units run by a user), else the unit.
    Not changed after it is made (replace() makes a copy), so its key is computed once: it is what every
    dict of holders hashes and compares, thousands of times a sample on a busy node."""

    FIELDS = (
        "account",
        "container",
        "container_id",
        "job_id",
        "namespace",
        "partition",
        "pod",
        "pod_uid",
        "unit",
        "user",
    )
    __slots__ = ("_key", "kind", *FIELDS)

    def __init__(
        self,
        kind: str,
        namespace: Optional[str] = None,
        pod: Optional[str] = None,
        container: Optional[str] = None,
        pod_uid: Optional[str] = None,
        container_id: Optional[str] = None,
        job_id: Optional[str] = None,
        unit: Optional[str] = None,
        user: Optional[str] = None,
        account: Optional[str] = None,
        partition: Optional[str] = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError("workload kind must be one of %s" % ", ".join(KINDS))
        self.kind = kind
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.pod_uid = pod_uid
        self.container_id = container_id
        self.job_id = job_id
        self.unit = unit
        self.user = user
        self.account = account  # a Slurm job's account and partition (None: not a job, or not known)
        self.partition = partition
        self._key: Optional[str] = None

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = self._make_key()
        return self._key

    def _make_key(self) -> str:
        if self.kind == POD:
            who = "%s/%s" % (self.namespace, self.pod) if self.namespace and self.pod else (self.pod_uid or "?")
            return "pod:%s/%s" % (who, self.container or self.container_id or "?")
        if self.kind == SLURM:
            return "slurm:%s" % self.job_id
        if self.kind == UNIT:
            return "unit:%s" % self.unit
        if self.kind == USER:
            return "user:%s" % self.user
        return UNKNOWN

    @property
    def team(self) -> str:
        if self.kind == POD:
            return self.namespace or "pod:%s" % (self.pod_uid or "?")
        if self.kind in (SLURM, USER) and self.user:
            return self.user
        if self.kind == UNIT and self.unit:
            return self.user or self.unit
        return TEAM_UNKNOWN

    def label(self) -> str:
        """How a person reads it: `team-a/trainer-0 (main)`, `Slurm job 4242 (alice)`."""
        if self.kind == POD:
            name = (
                "%s/%s" % (self.namespace, self.pod) if self.namespace and self.pod else "pod " + (self.pod_uid or "?")
            )
            return "%s (%s)" % (name, self.container) if self.container else name
        if self.kind == SLURM:
            return "Slurm job %s%s" % (self.job_id, " (%s)" % self.user if self.user else "")
        if self.kind == UNIT:
            return "unit %s" % self.unit
        if self.kind == USER:
            return "user %s" % self.user
        return "unknown owner"

    def to_record(self) -> Dict[str, Any]:
        """Compact: only the fields that are set (one record per node per window holds these)."""
        out: Dict[str, Any] = {"kind": self.kind}
        for name in RECORDED:
            value = getattr(self, name)
            if value:
                out[name] = value
        return out

    @classmethod
    def from_record(cls, doc: Dict[str, Any]) -> "Workload":
        kind = doc.get("kind", UNKNOWN)
        return cls(kind if kind in KINDS else UNKNOWN, **{f: doc.get(f) for f in RECORDED})

    def replace(self, **changes: Optional[str]) -> "Workload":
        """A copy with some fields changed: attribution parses ids first and fills the names in after."""
        fields: Dict[str, Optional[str]] = {name: getattr(self, name) for name in self.FIELDS}
        fields.update(changes)
        return Workload(self.kind, **fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workload) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return "Workload(%s)" % self.key


UNKNOWN_WORKLOAD = Workload(UNKNOWN)
