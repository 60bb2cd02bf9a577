"""Where a service's CPU time goes: py-spy samples a running PID (no code change, no restart)
and the collapsed stacks are summarised by leaf function (self time) and by mstar function
(inclusive time), as shares of the busy samples."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class Sampler:
    """Start before the load, `finish()` after: returns the summary (or None when py-spy is
    missing or not allowed to attach)."""

    def __init__(self, pid: int, seconds: float, out: Path, rate: int = 67) -> None:
        self.out = out
        exe = py_spy()
        self.proc = None
        if exe:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--duration", str(int(max(1, seconds))), "--rate", str(rate),
                 "--format", "raw", "--nonblocking", "-o", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self, timeout: float = 60) -> dict | None:
        if self.proc is None:
            return None
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        if not self.out.exists():
            return {"error": err.decode(errors="replace")[-300:]}
        return summarize(self.out.read_text())


def _name(frame: str, line: bool = False) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m["file"]
    for root in ("services/", "kernels/", "torch/", "grpc/", "google/protobuf/", "asyncio/"):
        if root in file:
            file = root + file.split(root, 1)[1]
            break
    else:
        file = Path(file).name
    return f"{m['func']} ({file}{':' + m['line'] if line and m['line'] else ''})"


def summarize(raw: str, top: int = 12) -> dict:
    self_time: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        raw_frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not raw_frames:
            continue
        frames = [_name(f) for f in raw_frames]
        total += n
        # Self time keeps the line: a native torch op shows up as the Python line that called it.
        self_time[_name(raw_frames[-1], line=True)] += n
        for f in set(frames):
            if "(services/" in f or "(kernels/" in f:
                inclusive[f] += n
    share = lambda c: [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)]  # noqa: E731
    return {"samples": total, "self_pct": share(self_time), "inclusive_pct": share(inclusive)}
