"""The process id the pools and the core compare on every call (``core/process.py``) follows a
fork without a system call per check: a child that read its parent's id would use the parent's
sockets. The pools' and the core's own fork tests (tests/test_fair_pool.py, tests/test_failover.py,
the near cache's) run through it too."""

from __future__ import annotations

import multiprocessing
import os
import warnings

from sentinel_cache.core.process import PROCESS


def _child_report(conn: multiprocessing.connection.Connection) -> None:
    conn.send((PROCESS.pid, os.getpid()))
    conn.close()


def test_a_forked_child_sees_its_own_pid() -> None:
    assert PROCESS.pid == os.getpid()
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # the child: report and leave at once, whatever happens
        try:
            os.write(write, f"{PROCESS.pid} {os.getpid()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        seen, real = map(int, os.read(read, 100).split())
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert (seen, real) == (pid, pid)
    assert PROCESS.pid == os.getpid() != pid  # the parent's is untouched


def test_a_multiprocessing_fork_child_sees_its_own_pid() -> None:
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        process = context.Process(target=_child_report, args=(child,))
        process.start()
    try:
        assert parent.poll(30), "the child did not report"
        seen, real = parent.recv()
    finally:
        process.join(30)
    assert not process.is_alive()
    assert seen == real == process.pid
    assert repr(PROCESS) == f"<Process pid={os.getpid()}>"
