"""A Slurm job's account and partition, for the usage records: cgroups give the job id only
(attribution.py), and the publisher's user cannot read another user's /proc/PID/environ (SLURM_JOB_ACCOUNT).

One `squeue --noheader --format=%A|%a|%P --jobs=ID,...` per usage window, for the ids not seen before (%A:
the job's own id, unique for each element of an array, as in the job's cgroup `job_<id>`; %a the account,
%P the partition: squeue(1)). Answers are cached per job id, bounded (MAX_JOBS, the oldest forgotten
first); a job squeue no longer lists (ended before its window closed, past MinJobAge) is remembered as
unknown too, so it is not asked for again. No squeue on the node (not a Slurm node): never asked again.
Python >= 3.9.
"""

import logging
import subprocess
from collections import OrderedDict
from typing import Callable, Dict, List, MutableMapping, Optional, Sequence, Tuple

from gpufleet_node.workload import SLURM, Workload

log = logging.getLogger("gpufleet.publisher")

MAX_JOBS = 4096  # job ids remembered (~100 bytes each)
IDS_PER_CALL = 200  # job ids in one squeue --jobs list (a long argv is fine; this keeps one call short)
SQUEUE_TIMEOUT_S = 5.0  # once per window on the sampling thread: short
NO_ACCOUNT = "(null)"  # what squeue prints for an unset field

Runner = Callable[[Sequence[str]], List[str]]
JobInfo = Tuple[Optional[str], Optional[str]]  # (account, partition)


def run_squeue(args: Sequence[str]) -> List[str]:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S, check=True)
    return out.stdout.splitlines()


def squeue_command(job_ids: Sequence[str]) -> List[str]:
    return ["squeue", "--noheader", "--format=%A|%a|%P", "--jobs=" + ",".join(job_ids)]


def parse(lines: Sequence[str]) -> Dict[str, JobInfo]:
    """`%A|%a|%P` lines -> job id: (account, partition); empty or "(null)" fields are None."""
    out: Dict[str, JobInfo] = {}
    for line in lines:
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 3 or not fields[0]:
            continue
        account, partition = (f if f and f != NO_ACCOUNT else None for f in fields[1:])
        out[fields[0]] = (account, partition)
    return out


class SlurmJobs:
    """Account and partition per job id, asked of squeue in batches and cached."""

    def __init__(self, runner: Runner = run_squeue, max_jobs: int = MAX_JOBS) -> None:
        self._runner = runner
        self._max_jobs = max_jobs
        self._known: "OrderedDict[str, JobInfo]" = OrderedDict()
        self.disabled = False  # no squeue here
        self.calls = 0

    def lookup(self, job_ids: Sequence[str]) -> Dict[str, JobInfo]:
        """What is known of these jobs; asks squeue once for those never asked (per IDS_PER_CALL)."""
        new = sorted({j for j in job_ids if j and j not in self._known})
        for i in range(0, len(new), IDS_PER_CALL):
            if self.disabled:
                break
            self._ask(new[i : i + IDS_PER_CALL])
        return {j: self._known[j] for j in job_ids if j in self._known}

    def _ask(self, batch: List[str]) -> None:
        self.calls += 1
        try:
            found = parse(self._runner(squeue_command(batch)))
        except FileNotFoundError:
            self.disabled = True
            log.info("no squeue on this node: Slurm jobs carry no account or partition")
            return
        except (OSError, subprocess.SubprocessError) as exc:
            # an invalid id makes squeue fail for the whole list ("Invalid job id specified") once every
            # job in it has ended: remembered as unknown, like a job it no longer lists
            log.warning("squeue for %d job(s) failed: %s", len(batch), exc)
            found = {}
        for job in batch:
            self._remember(job, found.get(job, (None, None)))

    def _remember(self, job: str, info: JobInfo) -> None:
        self._known[job] = info
        self._known.move_to_end(job)
        while len(self._known) > self._max_jobs:
            self._known.popitem(last=False)

    def enrich(self, workloads: MutableMapping[str, Workload]) -> None:
        """Fill in the account and partition of the Slurm jobs among a window's workloads, in place."""
        jobs = [w.job_id for w in workloads.values() if w.kind == SLURM and w.job_id and not w.account]
        if not jobs:
            return
        info = self.lookup(jobs)
        for key, w in list(workloads.items()):
            account, partition = info.get(w.job_id or "", (None, None)) if w.kind == SLURM else (None, None)
            if account or partition:
                workloads[key] = w.replace(account=account, partition=partition)
