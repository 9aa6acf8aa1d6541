"""How many CPU threads a run computes with: as many as the cores other processes leave free,
re-chosen while it runs.

Why: PyTorch's OpenMP threads spin while they wait for work. Alone that is what makes a small
model's step fast; beside a second PyTorch process on the same cores the two sets of spinning
threads steal each other's cores and both slow down far more than the 2x a fair share costs
(two ``shakespeare-cpu`` trainings on 2 cores: 10 s alone, 30-70 s each together).
``OMP_WAIT_POLICY=PASSIVE`` cures the pair but costs ~20 % alone, and must be chosen before torch
starts. Fewer threads cost nothing alone and can change at any time: every couple of seconds the
run reads how busy its cores were (``/proc/stat``) minus its own share (``/proc/self/stat``) and
uses the rest, at least one thread. A second training that starts beside it sees the first, and
the first sees it, so both drop to one thread each; when one ends, the other takes its cores back.

``--threads N`` (or ``OMP_NUM_THREADS`` in the environment, or a distributed run, which torchrun
gives one thread per process) fixes the count instead.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Seconds between two looks at the machine: long enough that a short burst of another process
# (a shell command, a notebook cell) does not take a core away, short enough to follow a second
# training within a few of its steps.
INTERVAL_S = 2.0


@dataclass
class CpuSample:
    """Cumulative CPU time, in seconds: spent by anyone on our cores, and by this process."""

    busy: float
    own: float
    wall: float


def our_cores() -> list[int]:
    """The CPU numbers this process may run on (its affinity, e.g. a container's or taskset's)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def read_cpu_sample(cores: list[int]) -> CpuSample | None:
    """Busy time of ``cores`` (user + nice + system + irq + softirq, from /proc/stat) and this
    process's CPU time (utime + stime of all its threads, /proc/self/stat); None off Linux."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
        wanted = {f"cpu{c}" for c in cores}
        busy = 0
        with open("/proc/stat") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] in wanted:
                    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[1:8])
                    busy += user + nice + system + irq + softirq
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # (the name may hold spaces)
        own = int(after_name[11]) + int(after_name[12])  # fields 14 and 15: utime, stime
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(busy / hz, own / hz, time.monotonic())


def others_busy(before: CpuSample, after: CpuSample) -> float:
    """How many cores' worth of time other processes kept busy between two samples."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall


def free_threads(cores: int, others: float) -> int:
    """Threads to use: the cores other processes leave free, rounded to the nearest whole core,
    at least one."""
    return max(1, min(cores, math.floor(cores - others + 0.5)))


class CpuShare:
    """Sets torch's thread count for a run and keeps it fitted to the free cores.

    ``fixed``: a thread count to keep (``--threads``); None adapts. ``sample`` (tests pass their
    own) returns a :class:`CpuSample` or None when the machine cannot tell (then the count stays).
    :meth:`poll` is cheap between looks; it returns the new count when it changed."""

    def __init__(
        self,
        fixed: int | None = None,
        *,
        cores: list[int] | None = None,
        sample: Callable[[list[int]], CpuSample | None] = read_cpu_sample,
        interval: float = INTERVAL_S,
    ) -> None:
        self.cores = cores if cores is not None else our_cores()
        self.fixed, self.sample, self.interval = fixed, sample, interval
        self.before_run = torch.get_num_threads()
        self.last: CpuSample | None = None
        self.others = 0.0  # cores' worth of time other processes used, at the last look
        env = os.environ.get("OMP_NUM_THREADS")
        if fixed is not None:
            self.threads, self.reason = fixed, "--threads"
        elif env:
            self.fixed = self.threads = torch.get_num_threads()
            self.reason = f"OMP_NUM_THREADS={env}"
        else:
            self.threads = len(self.cores)
            self.reason = f"auto: {len(self.cores)} cores; fewer while other processes keep them busy"
            self.last = self.sample(self.cores)
            if self.last is None:
                self.reason = f"auto: {len(self.cores)} cores (this system does not report their load)"
        torch.set_num_threads(self.threads)

    @property
    def adapting(self) -> bool:
        return self.fixed is None and self.last is not None

    def poll(self, now: float | None = None) -> int | None:
        """Look at the machine if ``interval`` seconds passed since the last look; return the new
        thread count if it changed (and set it), else None."""
        if not self.adapting:
            return None
        now = time.monotonic() if now is None else now
        if now - self.last.wall < self.interval:
            return None
        current = self.sample(self.cores)
        if current is None:
            return None
        self.others = others_busy(self.last, current)
        self.last = current
        threads = free_threads(len(self.cores), self.others)
        if threads == self.threads:
            return None
        self.threads = threads
        torch.set_num_threads(threads)
        return threads

    def describe(self) -> str:
        """The current choice in words, for the run's log."""
        return f"{self.threads} of {len(self.cores)} cores (other processes used {self.others:.1f})"

    def restore(self) -> None:
        """Give the process back the thread count it had before the run (a notebook, a test)."""
        torch.set_num_threads(self.before_run)
