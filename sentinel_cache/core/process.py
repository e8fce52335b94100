"""This process's id, read from memory: the pools and the core compare it on every call to
notice a fork (a child must not use its parent's sockets, locks or threads).

Why not ``os.getpid()``: it is a system call, about 0.45 µs on the development VM, and a get
made three of them. This copy is set again in every child by Python's at-fork hook, which
``os.fork``, ``multiprocessing`` and servers that fork through the C API (uWSGI, through
``PyOS_AfterFork_Child``) all run; a fork that skips it leaves the interpreter itself in an
unusable state.
"""

from __future__ import annotations

import os


class Process:
    """``pid``: this process's id, kept current across forks (see the module)."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __repr__(self) -> str:
        return f"<Process pid={self.pid}>"

    def forked(self) -> None:
        self.pid = os.getpid()


PROCESS = Process()
os.register_at_fork(after_in_child=PROCESS.forked)
