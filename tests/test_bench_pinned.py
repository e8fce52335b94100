"""make bench's pinned mode (benchmarks.measure.pinned): inside it every thread of this process
and the given processes run on the one CPU; afterwards each has its own CPUs back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from benchmarks.measure import pinned


def test_pinned_puts_this_process_and_the_servers_on_one_cpu_then_back() -> None:
    cpus = os.sched_getaffinity(0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, args=(60,), name="bench-pinned-helper")
    helper.start()
    try:
        tid = helper.native_id
        assert tid is not None
        target = max(cpus)
        with pinned([child.pid], cpu=target):
            assert os.sched_getaffinity(0) == {target}
            assert os.sched_getaffinity(tid) == {target}  # another thread of this process
            assert os.sched_getaffinity(child.pid) == {target}
        assert os.sched_getaffinity(0) == cpus
        assert os.sched_getaffinity(tid) == cpus
        assert os.sched_getaffinity(child.pid) == cpus
    finally:
        stop.set()
        helper.join(timeout=10)
        child.kill()
        child.wait()
    assert not helper.is_alive()
