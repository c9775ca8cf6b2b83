"""Being told when a file is written, instead of asking it on a timer: Linux inotify, through libc.

A process that polls a file ten times a second wakes ten times a second, busy or idle; on a small VM each
wake-up is a cold start of the interpreter's caches (an edge polling its key file spent 2.5 ms of CPU a
second doing nothing). The kernel can say when the file is written instead: :class:`FileWatch` adds the
files to one inotify descriptor on the event loop and calls back once per loop turn in which any of them
was written, truncated or replaced. Where inotify is missing (another OS, a libc without it, the
per-user watch limit reached) :meth:`FileWatch.start` returns None, and the caller keeps polling.

inotify sees writes made through this machine's kernel only (not another host's, over a network file
system), so a caller keeps a slow poll behind it as a backstop.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("nearshore.file_watch")

# <sys/inotify.h>
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# Written, truncated (IN_MODIFY), its metadata changed, or the file itself deleted or moved away.
WATCHED = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF

_READ_SIZE = 64 * 1024
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (a name of len bytes follows)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):  # not Linux, or a libc without inotify
        return None


class FileWatch:
    """One inotify descriptor watching ``paths`` on the running loop; ``changed`` is called (on the loop)
    at most once per loop turn, after any number of events. A path that does not exist yet, or was
    deleted, is watched again at the next :meth:`rewatch`."""

    def __init__(
        self, libc: ctypes.CDLL, fd: int, paths: Sequence[Path], changed: Callable[[], None]
    ) -> None:
        self._libc = libc
        self._fd = fd
        self._paths = [os.fsencode(p) for p in paths]
        self._changed = changed
        self._loop = asyncio.get_running_loop()
        self.watching = 0  # how many of the paths are watched now
        self.rewatch()
        self._loop.add_reader(fd, self._readable)

    @classmethod
    def start(cls, paths: Sequence[Path], changed: Callable[[], None]) -> FileWatch | None:
        """A watch on ``paths``, or None where inotify cannot be used here (the caller polls instead)."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:  # ENOSYS, or EMFILE: the per-user instance limit
            log.info("inotify unavailable (%s): polling instead", os.strerror(ctypes.get_errno()))
            return None
        watch = cls(libc, fd, paths, changed)
        if not watch.watching:  # not one of the files could be watched: polling says more
            watch.close()
            return None
        return watch

    def rewatch(self) -> None:
        """(Re)add each path that exists: one that was deleted and made again is a new file to watch.
        Adding a path already watched only renews its mask."""
        if self.closed:
            return
        watching = 0
        for path in self._paths:
            if self._libc.inotify_add_watch(self._fd, path, WATCHED) >= 0:
                watching += 1
            elif ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR):
                log.info("cannot watch %s: %s", os.fsdecode(path), os.strerror(ctypes.get_errno()))
        self.watching = watching

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1

    def _readable(self) -> None:
        gone = False
        while True:  # drain: a commit writes several pages, each an event
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:  # the descriptor broke: stop watching rather than wake on it forever
                log.warning("file watch stopped (%s): polling alone from now on", exc)
                self.close()
                self._changed()  # once more, so the caller looks now (and sees it closed)
                return
            if not data:
                break
            gone = gone or _any_gone(data)
        if gone:  # a watched file was deleted or replaced: watch whatever is at its path now
            self.rewatch()
        self._changed()  # once for all the events read


def _any_gone(data: bytes) -> bool:
    """Whether the events in ``data`` (struct inotify_event, one after another) say a watch ended (its
    file deleted or moved, IN_IGNORED) or the queue overflowed."""
    pos = 0
    while pos + _EVENT.size <= len(data):
        _wd, mask, _cookie, name_len = _EVENT.unpack_from(data, pos)
        if mask & (IN_IGNORED | IN_Q_OVERFLOW | IN_DELETE_SELF | IN_MOVE_SELF):
            return True
        pos += _EVENT.size + name_len
    return False
