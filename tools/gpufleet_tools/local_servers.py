"""What starting a local stack's server takes, whichever server it is (moto, a cluster's Kubernetes API):
a free loopback port to start it on and the wait until it answers. In a module of its own so that the stack
(local_stack.py) and the Kubernetes API (local_kube.py) both use it and neither imports the other for it.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def await_answer(probe: str, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    """Wait (10 s at most) until the server `proc` started answers HTTP on `probe`, any status (a 401
    answers too); it exiting first, or never answering, ends the command with one line saying so."""
    for _ in range(200):
        try:
            urllib.request.urlopen(probe, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"error: {what} exited (see {log})") from None
            time.sleep(0.05)
    raise SystemExit(f"error: {what} did not answer on {probe.rsplit('/', 2)[0]}")
