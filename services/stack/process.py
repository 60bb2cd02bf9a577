"""A child process that cannot outlive its parent and is stopped as a whole process group.

Each child gets its own session (so Ctrl-C in the terminal reaches only the launcher, which then
stops children in order) and PR_SET_PDEATHSIG=SIGKILL (so if the launcher dies without cleaning
up, e.g. SIGKILL, the kernel kills the children: no orphans holding ports).

The death signal is set by exec'ing through util-linux `setpriv --pdeathsig KILL` rather than by
a Python preexec_fn: a preexec_fn forces a plain fork(), and in a launcher that already runs gRPC
(the test suites) gRPC's fork handlers restarted its poller in the child, which then aborted on
the descriptors close_fds had closed (Envoy "exited -6", found by tests/reliability). Without a
preexec_fn, subprocess uses vfork/posix_spawn and no fork handler runs. The death signal survives
the exec into the real program, so the child's pid is still the program's own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

# Environment a child never inherits: the API keys belong to Envoy's rendered config alone
# (services/stack/api_keys.py); preprocess and generation have no use for them.
SECRET_ENV = ("MSTAR_API_KEYS",)


def _with_death_signal(argv: list[str]) -> list[str]:
    setpriv = shutil.which("setpriv")
    # Not Linux / no util-linux: process groups still make stop() reliable.
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else list(argv)


class Child:
    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        # The environment as it was at the first start: a restart (Supervisor) runs the same program.
        self.env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in SECRET_ENV}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the child; a restart appends
        self.proc = subprocess.Popen(
            _with_death_signal(argv), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=self.env, start_new_session=True, close_fds=True,
        )

    def respawn(self) -> Child:
        """Reap this child (and anything left in its group) and start the same program again."""
        self.stop(grace_s=0.0)
        return Child(self.name, self.argv, self.log_path, self.env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to grace_s, then SIGKILL it. Returns the exit code."""
        if self.alive():
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.alive():
            self.signal(signal.SIGKILL)
        code = self.proc.wait()
        self.signal(signal.SIGKILL)  # anything the child left behind in its group
        self._log.close()
        return code
