"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every output joulesched writes (results, timelines, plots, checkpoints, traces, stage records) goes through
:func:`atomic_path`: a uniquely named temporary file in the destination's own folder (so two overlapping runs
never share a temp name and the final rename stays on one filesystem), flushed to disk, then renamed over the
destination. On any error the temporary file is removed and the destination is untouched. A destination that
is a symbolic link is written through (the link stays); one that is a device, FIFO or socket is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from joulesched.core.errors import UsageError


def _fsync_dir(folder: Path) -> None:
    # The rename is durable only once the directory entry is on disk; not every filesystem allows it.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _writable_target(dest: Path) -> Path:
    """The regular file to replace for ``dest``: a symbolic link is followed (the link stays, its target is
    written), and a directory, a device, a FIFO or a socket is refused (a review: ``-o /dev/full`` and a FIFO
    were replaced by regular files; a directory would fail only after the work)."""
    if dest.is_symlink():
        dest = Path(os.path.realpath(dest))
    if dest.is_dir():  # os.replace would fail with IsADirectoryError after the work is done
        raise UsageError(f"{dest} is a directory; cannot write a file there (remove it, or write elsewhere)")
    if _special(dest):
        raise UsageError(f"{dest} exists and is not a regular file (a device, FIFO or socket); write elsewhere")
    return dest


def _special(path: Path) -> bool:
    """``path`` exists and is neither a regular file nor a directory: one stat, so a file another writer
    replaces or removes meanwhile is never mistaken for one (exists() then is_file() raced)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``dest`` (creating its folder); when the block succeeds, fsync it and
    rename it to ``dest``.

    ``mode`` sets the file's permissions (default: what a plain ``open`` would give under the umask).
    """
    dest = _writable_target(Path(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)  # an output path names its folder too: create it
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # mkstemp creates 0600
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(dest: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``dest`` atomically; returns the destination."""
    with atomic_path(dest, mode) as tmp:
        tmp.write_bytes(data)
    return Path(dest)


def atomic_write_text(dest: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``dest`` atomically; returns the destination."""
    return atomic_write_bytes(dest, text.encode("utf-8"), mode)


def atomic_savefig(fig, dest: str | os.PathLike, **savefig_kw) -> Path:
    """A matplotlib figure saved to ``dest`` atomically, in the format its suffix names (default PNG)."""
    fmt = savefig_kw.pop("format", None) or (Path(dest).suffix.lstrip(".") or "png")
    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format=fmt, **savefig_kw)
    return Path(dest)


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _check_creatable(folder: Path, option: str) -> None:
    """``folder`` exists as a writable directory, or can be created where its nearest existing parent is."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise UsageError(f"{option}: {base} is not a directory, so {folder} cannot be created")
    # A real probe: permission bits say nothing for root, a read-only mount or /proc.
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".joulesched-probe-")
    except OSError as e:
        # The kernel's words can mislead: /proc answers "No such file or directory" for a folder that exists.
        why = {errno.ENOENT: "it takes no new files (a virtual file system such as /proc or /sys)",
               errno.EROFS: "it is on a read-only file system", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied", errno.ENOSPC: "no space left"}.get(e.errno, e.strerror or str(e))
        raise UsageError(f"{option}: cannot create files in {base}: {why}; choose a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def read_text_input(path: str | os.PathLike, what: str, error: type[Exception] = UsageError,
                    missing: str | None = None) -> str:
    """A UTF-8 text file the user named, every way it can fail one ``error`` naming the file and ``what`` it
    should be: not there (``missing``, if given, is that message), a directory, unreadable, not UTF-8."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(missing or f"{p}: no such file ({what} was expected)") from None
    except IsADirectoryError:
        raise error(f"{p} is a directory, not {what}") from None
    except UnicodeDecodeError as e:
        raise error(f"{p}: not UTF-8 text (byte {e.start}); is this {what}?") from None
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None


def _path_given(path: str | os.PathLike, option: str) -> Path:
    # Path("") is ".": an empty option would quietly mean the current folder.
    if not str(path).strip():
        raise UsageError(f"{option} is empty; give a path")
    return Path(path)


def check_output_file(path: str | os.PathLike, option: str,
                      inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Fail now, before any work, if ``path`` cannot be written as a file (checked again by the write), or is
    one of the command's ``inputs`` (it would be overwritten with the output)."""
    path = _path_given(path, option)
    for inp in inputs:
        if path.resolve() == Path(inp).resolve():
            raise UsageError(f"{option} {path} is also an input of this command; writing it would replace it")
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name")
    if _special(path):
        raise UsageError(f"{option} {path} exists and is not a regular file (a device, FIFO or socket)")
    _check_creatable(path.parent if str(path.parent) else Path("."), f"{option} {path}")
    return path


def check_output_dir(path: str | os.PathLike, option: str, files: Iterable[str] = ()) -> Path:
    """Fail now, before any work, if ``path`` cannot be used as an output folder, or one of the ``files`` the
    command writes in it is a directory there."""
    path = _path_given(path, option)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} exists and is not a directory")
    for name in files:
        if (path / name).is_dir():
            raise UsageError(f"{option} {path}: {name} there is a directory, where this command writes a file; "
                             "remove it or choose another folder")
        if _special(path / name):  # refused only after the run otherwise
            raise UsageError(f"{option} {path}: {name} there is not a regular file (a device, FIFO or socket)")
    _check_creatable(path, f"{option} {path}")
    return path
