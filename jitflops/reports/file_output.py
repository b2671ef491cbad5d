"""Writing report files the way a careful editor saves: atomically, in place, and saying what failed.

A local file is written to a temporary file beside its real target (a symbolic link is followed,
and stays a link), which then replaces the target in one rename, so an interrupted or failed run
leaves neither a half-written file nor a temporary one behind. The new file keeps the mode of the
file it replaces. Missing parent directories are created, as DeepSpeed's ``output_file`` does; a
directory as the target is refused. Every error names the path the user gave. Paths with a scheme
(``s3://``, ``manifold://``) go through iopath's ``PathManager``, as in fvcore.

In a multi-process run only rank 0 writes.
"""

from __future__ import annotations

import os
import stat
import tempfile

from iopath.common.file_io import g_pathmgr as PathManager

from ..profiling.ranks import is_writer
from ..core.errors import JitflopsError


class OutputError(JitflopsError):
    """A report file cannot be written; names the path the user gave."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"cannot write {path!r}: {problem}")
        self.path = path


def _is_remote(path: str) -> bool:
    return "://" in path


def check_writable(path: str) -> None:
    """Fail early, before any work, where ``path`` cannot be written: a directory, or a parent
    that cannot be created or written to. Creates missing parent directories."""
    if _is_remote(path):
        return
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise OutputError(path, "it is a directory")
    parent = os.path.dirname(target) or "."
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as error:
        raise OutputError(path, f"its directory cannot be created ({error.strerror})") from error
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(path, f"its directory {parent!r} is not writable")


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see the module's docstring)."""
    if not is_writer():
        return
    if _is_remote(path):
        _write_remote(path, text)
        return
    check_writable(path)
    target = os.path.realpath(path)
    mode = stat.S_IMODE(os.stat(target).st_mode) if os.path.exists(target) else None
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(target) or ".", prefix=f".{os.path.basename(target)}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, mode if mode is not None else 0o666 & ~_umask())
        os.replace(temporary, target)
    except BaseException as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        if isinstance(error, OSError):
            raise OutputError(path, error.strerror or str(error)) from error
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_remote(path: str, text: str) -> None:
    """Through iopath: a temporary object, then replaced as well as the store's handler allows."""
    temporary = f"{path}.partial-{os.getpid()}"
    try:
        with PathManager.open(temporary, "w") as stream:
            stream.write(text)
        if PathManager.exists(path):
            PathManager.rm(path)
        PathManager.mv(temporary, path)
    except BaseException as error:
        if PathManager.exists(temporary):
            PathManager.rm(temporary)
        if isinstance(error, OSError):
            raise OutputError(path, str(error)) from error
        raise
