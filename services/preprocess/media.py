"""Reading `file_path` prompt parts safely.

Off unless the server is started with an allow-listed root (`--file-root`). Then a path is
resolved component by component with openat-style calls (`os.open(name, dir_fd=parent)`) and
O_NOFOLLOW on every component, so no symlink is ever followed (not even one inside the root);
`..` is refused outright rather than normalised. The final file is opened O_NONBLOCK (a FIFO
would otherwise block the open), must be a regular file by fstat of the opened descriptor (no
check-then-open race) and is read up to the size cap. Every refusal is PERMISSION_DENIED.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from services.common.errors import MstarError, permission_denied, quote

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class FileReader:
    """Reads files under one allow-listed root, or refuses every path when root is None."""

    def __init__(self, root: Path | None, max_bytes: int) -> None:
        self.root = Path(root).resolve() if root is not None else None
        self.max_bytes = max_bytes

    def read(self, path: str) -> bytes:
        if self.root is None:
            raise _denied(
                "file_path inputs are disabled on this server (no --file-root)", "FILE_PATHS_DISABLED"
            )
        components = self._components(path)
        fds: list[int] = []
        try:
            fds.append(os.open(self.root, _DIR_FLAGS))
            for name in components[:-1]:
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
            fd = os.open(components[-1], _FILE_FLAGS, dir_fd=fds[-1])
            fds.append(fd)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _denied(f"{quote(path)} is not a regular file")
            if info.st_size > self.max_bytes:
                raise _denied(f"{quote(path)} is larger than {self.max_bytes} bytes", "FILE_TOO_LARGE")
            data = os.read(fd, self.max_bytes + 1)
            if len(data) > self.max_bytes:  # grew after fstat
                raise _denied(f"{quote(path)} is larger than {self.max_bytes} bytes", "FILE_TOO_LARGE")
            return data
        except MstarError:
            raise
        except OSError as exc:
            # ELOOP (a symlink), ENOTDIR, ENOENT, EACCES...: all the same to the client.
            raise _denied(f"{quote(path)} cannot be read under the allowed root ({exc.strerror})") from exc
        finally:
            for fd in fds:
                os.close(fd)

    def _components(self, path: str) -> list[str]:
        if not path or "\x00" in path:
            raise _denied("empty or invalid file_path")
        candidate = Path(path)
        if candidate.is_absolute():
            # Absolute paths are accepted only when they are lexically under the root.
            try:
                candidate = candidate.relative_to(self.root)
            except ValueError:
                raise _denied(f"{quote(path)} is outside the allowed root") from None
        parts = [p for p in candidate.parts if p not in ("", ".")]
        if not parts or any(p == ".." for p in parts):
            raise _denied(f"{quote(path)} must name a file under the allowed root without '..'")
        return parts


def _denied(message: str, reason: str = "FILE_PATH_DENIED") -> MstarError:
    return permission_denied(message, reason=reason)
