"""One owner at a time for a folder a run writes (a run folder, a screen's output).

A holder takes the folder before it writes anything there and keeps it until it ends:

- **a kernel lock** (``flock``) on ``<folder>/.gears_ddp.lock``, which the kernel releases
  however the holder ends (SIGKILL included), so nothing stale is left on a local disk or a
  filesystem whose locks every machine sees (NFSv4, GPFS, Lustre mounted with ``flock``);
- **a record** of the holder, ``<folder>/.gears_ddp_owner.json`` (host, process id, since
  when, the command, the scheduler's job), which a refused run names, refreshed every
  ``HEARTBEAT_S`` seconds while the folder is held and removed when it is released.

Some shared filesystems grant locks that only one machine sees (NFS mounted ``nolock``,
Lustre ``localflock``), so a granted lock is not trusted alone: a record of a holder on
another machine whose heartbeat is younger than ``STALE_S`` refuses the folder (failing
closed), unless it is an earlier attempt of this same scheduler job (a torchrun restart, a
requeued Slurm job). A record of this machine under a granted lock is a holder that ended
without releasing (the kernel released its lock). Where the filesystem refuses locks
altogether, the record alone decides, created exclusively (``os.link``).
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = ".gears_ddp.lock"
RECORD_FILE = ".gears_ddp_owner.json"
HEARTBEAT_S = 30.0
STALE_S = 120.0  # a record from another machine not refreshed for this long belongs to a holder that is gone
# errors of a filesystem that does not do file locks (the record alone decides there)
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


class FolderInUse(RuntimeError):
    """The folder is held by another run; the message names the folder, the holder and what
    to do."""


def this_job() -> dict | None:
    """The scheduler job this process belongs to (None outside one): ``scheduler`` and ``id``
    (Slurm's job id, which a requeued job keeps, else torchrun's run id) and ``attempt``,
    the restarts so far: ``[Slurm's requeues]`` and/or ``[torchrun's restarts]``, in that
    order, so that a later attempt compares greater."""
    slurm = os.environ.get("SLURM_JOB_ID")
    torchrun = os.environ.get("TORCHELASTIC_RUN_ID") or ("?" if "TORCHELASTIC_RESTART_COUNT" in os.environ else None)
    if not (slurm or torchrun):
        return None
    attempt = []
    for present, variable in ((slurm, "SLURM_RESTART_COUNT"), (torchrun, "TORCHELASTIC_RESTART_COUNT")):
        if present:
            try:
                attempt.append(int(os.environ.get(variable, "0") or 0))
            except ValueError:
                attempt.append(0)
    return {"scheduler": "slurm" if slurm else "torchrun", "id": slurm or torchrun, "attempt": attempt}


def is_restart(job: dict | None) -> bool:
    """Whether ``job`` (``this_job()``) is a restarted or requeued attempt."""
    return any(job["attempt"]) if job else False


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """A holder's record as the file says it."""

    record: dict

    @property
    def host(self) -> str:
        return str(self.record.get("host", "?"))

    def age_s(self) -> float:
        """Seconds since the holder last refreshed its record (by this machine's clock)."""
        try:
            return max(0.0, time.time() - float(self.record["heartbeat"]))
        except (KeyError, TypeError, ValueError):
            return float("inf")

    def described(self) -> str:
        record = self.record
        job = record.get("job")
        where = f"process {record.get('pid', '?')} on host {self.host}"
        if job:
            where += f", {job.get('scheduler')} job {job.get('id')}"
        command = record.get("command")
        return (
            f"{where} ({record.get('what', 'a run')}{'; command: ' + command if command else ''}), since "
            f"{record.get('since', '?')}"
        )

    def is_earlier_attempt_of(self, job: dict | None) -> bool:
        """Whether this holder was an earlier attempt of ``job`` (a restart of the same job)."""
        held = self.record.get("job")
        return bool(
            job
            and isinstance(held, dict)
            and held.get("scheduler") == job["scheduler"]
            and held.get("id") == job["id"]
            and isinstance(held.get("attempt"), list)
            and held["attempt"] < job["attempt"]
        )


def _read_holder(path: Path) -> Holder | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        record = {}
    return Holder(record if isinstance(record, dict) else {})


class FolderLock:
    """Holds ``folder`` for this process (``with FolderLock(folder, what):``). ``what`` says
    what holds it in a refused run's message ("training", "a pair screen"); ``advice``
    ends that message (what the refused user can do)."""

    def __init__(self, folder, what: str, advice: str = "", lock_name: str = LOCK_FILE, record_name: str = RECORD_FILE):
        self.folder = Path(folder)
        self.what, self.advice = what, advice
        self.lock_path, self.record_path = self.folder / lock_name, self.folder / record_name
        self._fd: int | None = None
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.held = False

    # ------------------------------------------------------------------ taking and releasing
    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the folder (which must exist) or raise ``FolderInUse`` naming its holder."""
        kernel_lock = self._kernel_lock()
        try:
            holder = _read_holder(self.record_path)
            if holder is not None and not self._may_take_over(holder, kernel_lock):
                raise self._in_use(holder)
            record = self._record()
            if kernel_lock:
                self._write_record(record)
            else:
                self._create_record(record, holder)
        except BaseException:
            self._unlock()
            raise
        self.held = True
        self._heartbeat = threading.Thread(target=self._beat, name=f"gears_ddp folder lock {self.folder}", daemon=True)
        self._heartbeat.start()

    def release(self) -> None:
        """Give the folder back (removes the record; the lock file stays, empty)."""
        if not self.held:
            return
        self.held = False
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()
        holder = _read_holder(self.record_path)
        if holder is not None and holder.record.get("token") == self._token:
            self.record_path.unlink(missing_ok=True)
        self._unlock()

    # ------------------------------------------------------------------ the kernel lock
    def _kernel_lock(self) -> bool:
        """Take the kernel lock: True when held, False where the filesystem has no locks;
        ``FolderInUse`` when another process holds it."""
        try:
            import fcntl
        except ImportError:  # no fcntl (Windows): the record alone decides
            return False
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)  # as the umask allows
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use(_read_holder(self.record_path)) from None
        except OSError as err:
            os.close(fd)
            if err.errno in NO_LOCKS:
                return False
            raise
        self._fd = fd
        return True

    def _unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the lock
            self._fd = None

    # ------------------------------------------------------------------ the record
    def _may_take_over(self, holder: Holder, kernel_lock: bool) -> bool:
        """Whether a record found in the folder belongs to a holder that is gone."""
        if holder.is_earlier_attempt_of(this_job()):
            return True
        same_host = holder.host == socket.gethostname()
        if kernel_lock and same_host:
            return True  # the kernel released that holder's lock: it has ended
        if same_host and isinstance(holder.record.get("pid"), int) and not _is_alive(holder.record["pid"]):
            return True
        return holder.age_s() > STALE_S

    def _record(self) -> dict:
        now = time.time()
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "heartbeat": now,
            "what": self.what,
            "command": _command(),
            "job": this_job(),
            "token": self._token,
        }

    def _write_record(self, record: dict) -> None:
        """Replace the record atomically (readers see the old one or the new one)."""
        tmp = self.record_path.with_name(f"{self.record_path.name}.{self._token}.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self.record_path)

    def _create_record(self, record: dict, stale: Holder | None) -> None:
        """Without kernel locks: create the record only where none is (``os.link`` fails
        on an existing name, on NFS too), after moving a stale one aside."""
        tmp = self.record_path.with_name(f"{self.record_path.name}.{self._token}.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        try:
            if stale is not None:
                aside = self.record_path.with_name(f"{self.record_path.name}.{self._token}.stale")
                try:
                    os.rename(self.record_path, aside)
                except FileNotFoundError:
                    pass
                else:
                    moved = _read_holder(aside)
                    aside.unlink(missing_ok=True)
                    if moved is not None and moved.record.get("token") != stale.record.get("token"):
                        raise self._in_use(moved)  # another run took it in the meantime
            try:
                os.link(tmp, self.record_path)
            except FileExistsError:
                raise self._in_use(_read_holder(self.record_path)) from None
        finally:
            tmp.unlink(missing_ok=True)

    def _beat(self) -> None:
        """Refresh the record's heartbeat until released."""
        while not self._stop.wait(HEARTBEAT_S):
            holder = _read_holder(self.record_path)
            if holder is None or holder.record.get("token") != self._token:
                continue  # taken over (this process stopped for longer than STALE_S): leave the new holder's record
            try:
                self._write_record({**holder.record, "heartbeat": time.time()})
            except OSError:
                pass  # a full or unreachable disk: the next beat tries again

    def _in_use(self, holder: Holder | None) -> FolderInUse:
        who = holder.described() if holder is not None and holder.record else "another process (no record of it yet)"
        if holder is not None and holder.host != socket.gethostname() and holder.record:
            who += f", last seen {holder.age_s():.0f} s ago"
        return FolderInUse(
            f"{self.folder} is in use by {who}: wait for it to end or stop it"
            f"{', ' + self.advice if self.advice else ''}"
        )


def _command() -> str:
    """This process's command line, shortened."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
    return command if len(command) <= 200 else command[:197] + "..."
