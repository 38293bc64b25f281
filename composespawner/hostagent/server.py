"""``composespawner-host-server``: the host agent's one long-lived process on a host.

``composespawner-host-server [--socket PATH]``. Every start, stop, poll and watch is an
SSH channel whose forced command used to start Python and import the agent afresh: in a
class starting at once, that was most of a host's work for each notebook. This process
imports the agent once, listens on ``--socket`` (``handoff.DEFAULT_SOCKET`` by default;
root's alone: mode 0600, and every peer's credentials checked), and
for each channel a forced command hands it (:mod:`handoff`) forks a child that runs the
request on the channel's own descriptors, as the forced command would have run it:
its own process, its own session, the config read afresh, the same locks, records and
logs. Nothing a request does stays in this process, so a request that crashes ends its
child alone, and this one holds no state to lose: stopping it (systemd's
``KillMode=process``) leaves running requests and notebooks alone, and forced commands
run their requests themselves until it is back.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import NamedTuple, NoReturn

from composespawner.hostagent.channel import run_channel
from composespawner.hostagent.handoff import (
    CHANNEL_FDS,
    MAX_HEADER,
    PASSED_VARIABLES,
    TAKEN,
    HandoffError,
    decode,
    parse_arguments,
    read_arguments,
)

log = logging.getLogger("composespawner.hostagent.server")
LOG_FORMAT = "%(asctime)s composespawner-host-server[%(process)d] %(levelname)s %(message)s"
RECEIVE_TIMEOUT = 2.0  # a forced command sends its channel as soon as it connects
BACKLOG = 128  # a class's channels arriving at once wait here, not in refusals
# What a request imports, imported here once so that no child imports it again.
WARM = (
    "ctypes",  # a start's child becomes the account through libc (launchers.accounts)
    "composespawner.hostagent.notebooks",
    "composespawner.hostagent.stacks",
    "composespawner.activity.nvml",
)


def main(argv: list[str] | None = None) -> int:
    _open_standard_descriptors()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    args = sys.argv[1:] if argv is None else argv
    try:
        config, where = parse_arguments(args)
    except ValueError as e:
        log.error("cannot start: %s", e)
        return 2
    if config is not None:  # each request reads the config its forced command names
        log.error("cannot start: usage: composespawner-host-server [--socket PATH]")
        return 2
    path = Path(where)
    for module in WARM:
        importlib.import_module(module)
    # What is here now is every child's too: the collector of each child must not walk
    # it (that touches every page, and copies them all from this process on write).
    gc.freeze()
    try:
        listener = listen(path)
        bound = path.stat()
    except OSError as e:
        log.error("cannot listen on %s: %s", path, e)
        return 2
    signal.signal(signal.SIGTERM, _leave)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    log.info("serving the host agent on %s", path)
    try:
        serve(listener)
    except KeyboardInterrupt:
        pass
    finally:
        stop_listening(listener, path, bound)
    return 0


def listen(path: Path) -> socket.socket:
    """A socket bound at ``path``, root's alone from the start; OSError where another
    server already answers there (a stale socket of a dead one is replaced)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_socket():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # nothing answers: a server that died left it
            else:
                raise OSError(f"another server answers on {path}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)  # created 0600: never a moment open to others
    try:
        listener.bind(str(path))
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(mask)
    listener.listen(BACKLOG)
    return listener


def stop_listening(listener: socket.socket, path: Path, bound: os.stat_result) -> None:
    """Close ``listener`` and remove its socket (``bound``: the file as bound), unless
    another server has replaced it since."""
    listener.close()
    with contextlib.suppress(OSError):
        now = path.stat()
        if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
            path.unlink()


def serve(listener: socket.socket) -> None:
    """Take each channel handed over, each in a child of its own (never returns)."""
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                channel = take(conn)
            except (OSError, HandoffError) as e:
                log.warning("refused a connection: %s", e)
                continue
            if channel is None:
                continue  # only a look at whether this server answers
            try:
                pid = os.fork()
            except OSError as e:  # the forced command runs the request itself
                log.error("cannot fork for a channel: %s", e)
                pid = -1
            if pid == 0:
                run_child(listener, conn, channel)
            for fd in channel.fds:
                os.close(fd)


class Channel(NamedTuple):
    """One SSH channel, as the server receives it."""

    args: list[str]
    environ: dict[str, str]
    fds: list[int]  # stdin, stdout, stderr: the receiver's to close


def take(conn: socket.socket) -> Channel | None:
    """The channel on ``conn``, from root alone: the forced command runs as root."""
    _pid, uid, _gid = struct.unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    )
    if uid != 0:
        raise HandoffError(f"uid {uid} is not root")
    conn.settimeout(RECEIVE_TIMEOUT)
    return receive(conn)


def receive(conn: socket.socket) -> Channel | None:
    """The channel a forced command handed over on ``conn``, None where nothing was sent
    (a look at whether a server answers); HandoffError (any descriptors sent closed) for
    anything but one header and three descriptors."""
    data, fds, _flags, _address = socket.recv_fds(conn, MAX_HEADER, CHANNEL_FDS + 1)
    if not data and not fds:
        return None
    try:
        if len(fds) != CHANNEL_FDS:
            raise HandoffError(f"{len(fds)} descriptors sent, not {CHANNEL_FDS}")
        args, environ = decode(data)
    except HandoffError:
        for fd in fds:
            os.close(fd)
        raise
    return Channel(args, environ, fds)


def run_child(listener: socket.socket, conn: socket.socket, channel: Channel) -> NoReturn:
    """In the forked child: become the forced command's process, run its request, and
    send its exit status back."""
    status = 1
    try:
        listener.close()
        for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(number, signal.SIG_DFL)  # not this server's: a request's own
        os.setsid()  # as sshd gives each channel's command a session of its own
        for target, fd in enumerate(channel.fds):
            os.dup2(fd, target)
            os.close(fd)
        for name in PASSED_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(channel.environ)
        conn.settimeout(None)
        conn.sendall(TAKEN)
        config, _socket, usage = read_arguments(channel.args)
        status = run_channel(config, usage=usage)
    except BaseException:  # the status still goes back; the trace to the channel's stderr
        logging.getLogger("composespawner.hostagent").exception("the request's process failed")
    finally:
        with contextlib.suppress(OSError):
            conn.sendall(bytes([status & 0xFF]))
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _open_standard_descriptors() -> None:
    """/dev/null on any of 0, 1, 2 that is closed, so that a channel's descriptors are
    received above them and a child's dup2 onto 0, 1, 2 never closes one it needs."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _leave(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
