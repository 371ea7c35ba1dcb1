"""Whole-process measurement for the benchmark scripts: wall time, and the peak of the
resident memory of the process and all its descendants together, sampled from /proc
(so worker processes count at once, not one by one); GNU time's %M, the peak of the
largest single process, is printed beside it. Not a test helper: nothing asserts."""

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Measured:
    seconds: float
    peak_mib: float  # GNU time's %M: the largest process's own peak (exact; the whole story for one process)
    tree_peak_mib: float  # all processes at once, sampled every 10 ms
    returncode: int
    stdout: str
    stderr: str


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += _rss_kib(p)
        todo += _children(p)
    return total


def run(cmd: list[str], env: dict | None = None) -> Measured:
    """Run ``cmd`` to the end under GNU time, sampling its process tree's resident memory."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        start = time.perf_counter()
        proc = subprocess.Popen(
            ["/usr/bin/time", "-o", timing.name, "-f", "%M", *cmd],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        result = _watch(proc, start)
        result.peak_mib = int(timing.read().strip().splitlines()[-1]) / 1024
    return result


def _watch(proc: subprocess.Popen, start: float) -> Measured:
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_kib(proc.pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return Measured(seconds, 0.0, peak / 1024, proc.returncode, out, err)


def load() -> str:
    return f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
