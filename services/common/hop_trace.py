"""Opt-in timestamps of every token at every hop of the serving path (bench/hops.py reads them).

    MSTAR_HOP_TRACE=/some/dir make run     # each process writes /some/dir/<pid>.tsv
    kill -USR2 <pid>                       # pause / resume recording in that process

Off (the variable unset: every normal run) a hop costs one module-attribute test at its call site,
`if hop_trace.ON:`, and nothing else. On, `mark()` appends a tuple to a list; `flush()` writes the
list out when a request ends (and at exit), so no file I/O ever sits between two tokens. SIGUSR2
flips ON in a process started with the variable, so one run can compare the same processes with
the trace on and off (bench/hops.py); a process started without it installs no handler.

A record is `hop, key, index, time_ns, extra` (one tab-separated line). time_ns is the wall clock
(`time.time_ns()`, CLOCK_REALTIME): the three processes of one box share it, so a token's records
from generation and preprocess can be subtracted. `key`/`index` name the token: the generation
stream's request key ("r1f") and the token's position in the output, or the public request id and
a chunk number (bench/hop_table.py joins them; its docstring lists the hops).
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from pathlib import Path

ENV = "MSTAR_HOP_TRACE"
ON = bool(os.environ.get(ENV))

_records: list[tuple[str, str, int, int, object]] = []


def mark(hop: str, key: str, index: int, extra: object = "", at_ns: int | None = None) -> None:
    """Record that token `index` of request `key` passed `hop` now (or at `at_ns`)."""
    _records.append((hop, key, index, time.time_ns() if at_ns is None else at_ns, extra))


def flush() -> None:
    """Append what was recorded to this process's file (called at request ends and at exit)."""
    if not _records:
        return
    lines = "".join(f"{hop}\t{key}\t{index}\t{t}\t{extra}\n" for hop, key, index, t, extra in _records)
    _records.clear()
    directory = Path(os.environ[ENV])
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{os.getpid()}.tsv", "a") as f:
        f.write(lines)


def _toggle(_signum: int, _frame: object) -> None:
    global ON
    ON = not ON


if ON:
    atexit.register(flush)
    try:
        signal.signal(signal.SIGUSR2, _toggle)
    except ValueError:  # imported first off the main thread: no toggle, always on
        pass
