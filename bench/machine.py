"""What the whole machine spends, for the bench scripts (imported from bench/, which is on sys.path
when a script runs as ``python bench/NAME.py``)."""

from __future__ import annotations

import os


def machine_cpu() -> float:
    """CPU-seconds the whole machine has spent busy (every process, user and system), from
    /proc/stat: all ticks minus idle and iowait."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
