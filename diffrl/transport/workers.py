"""Where reward calls run, so that none can hang the run or outlive it.

- :class:`CallThread`: an in-process reward's calls, one at a time in submit order, each on a
  daemon thread of its own, watched by the reward's lane thread. A call still running at its
  deadline is failed and left to its thread (Python cannot kill a thread; a daemon one at least
  does not hold up the interpreter's exit, where a ``ThreadPoolExecutor``'s threads are joined),
  and the next call starts at once.
- :class:`ProcessPool`: spawned worker processes (e.g. OCR's) with deadlines: when a call overruns
  its deadline it is failed and the workers killed (one of them is stuck) and restarted.
- :func:`die_with_parent`: called first in every pool worker, so that workers die with the
  process that started them, ``kill -9`` included. Without it a killed trainer leaves its workers
  behind (several hundred MB each), blocked forever on a job queue whose writing end they hold
  themselves, and multiprocessing's resource tracker with them (it exits once every process that
  holds its pipe is gone).

Deadlines are enforced when they pass, not when someone waits: a reward's calls run one at a
time, so a hung call must not hold the ones behind it until the collector gets round to waiting.
This module depends on nothing else in diffrl: ``rewards/base.py`` builds the reward API on it.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
PARENT_POLL_S = 1.0
"""How often a worker checks that its parent still lives (where ``PR_SET_PDEATHSIG`` is not had)."""
MAX_RESENDS = 2
"""How often one pool job may be re-sent to fresh workers after the pool was restarted under it
(another call overran its deadline, or a worker died)."""


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity (which ``taskset``, a container's
    cpuset or a batch scheduler narrow), not ``os.cpu_count()`` (every core of the machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS, Windows): the machine's count
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory available to new processes now (Linux's ``MemAvailable``: free memory
    and what the page cache can give back); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def pool_size(bytes_per_worker: int, most: int) -> int:
    """How many workers a pool gets by default: one per usable core (:func:`usable_cores`), at
    most ``most`` (more than there is work for only hold memory), and no more than fit in half
    of :func:`available_memory` at ``bytes_per_worker`` each; at least 1."""
    n = min(most, usable_cores())
    memory = available_memory()
    if memory is not None:
        n = min(n, memory // 2 // bytes_per_worker)
    return max(1, n)


class DeadlineExceeded(TimeoutError):
    """A reward call was still unfinished at its deadline."""


def die_with_parent(parent_pid: int, poll_s: float = PARENT_POLL_S, pdeathsig: bool = True) -> None:
    """Make this process exit as soon as ``parent_pid`` (the process that started it) exits.

    On Linux the kernel sends SIGKILL at the parent's death (``prctl(PR_SET_PDEATHSIG)``; the
    "parent" is the *thread* that started this process, see :class:`ProcessPool`). Everywhere, a
    daemon thread also polls ``os.getppid()`` every ``poll_s`` seconds: a child whose parent died
    is handed to another process (init or a subreaper), so its parent pid changes.
    ``pdeathsig=False`` leaves the poll alone (what other systems get; a test checks it).
    """
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl (e.g. a static musl build): the poll remains
            pass
    # the parent may have died before the prctl took effect: then no signal ever comes
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(
        target=_watch_parent, args=(parent_pid, poll_s), name="die-with-parent", daemon=True
    ).start()


def _watch_parent(parent_pid: int, poll_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    os._exit(1)  # no clean-up: it could block (joins, queues) on what the dead parent held


def deadline_after(timeout: float | None) -> float | None:
    """``timeout`` seconds from now on the ``time.monotonic()`` clock (``None``: no deadline)."""
    return None if timeout is None else time.monotonic() + timeout


def seconds_left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def result_by(future: cf.Future, deadline: float | None) -> Any:
    """``future.result()``, or :class:`DeadlineExceeded` if it is unfinished at ``deadline``
    (a ``TimeoutError`` raised by the call itself propagates as it is)."""
    try:
        return future.result(seconds_left(deadline))
    except TimeoutError:
        if future.done():  # raised by the call, or done just now: what it gave
            return future.result()
        raise DeadlineExceeded("unfinished at its deadline") from None


def _settle(future: cf.Future, value: Any = None, error: BaseException | None = None) -> None:
    """Finish ``future`` unless it is finished already (a stuck call's late result is dropped)."""
    try:
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    except cf.InvalidStateError:
        pass


# ------------------------------------------------------------------------------------------------
# In-process calls
# ------------------------------------------------------------------------------------------------


def _call_into(
    future: cf.Future, fn: Callable[..., Any], args: tuple, returned: threading.Event | None = None
) -> None:
    try:
        value = fn(*args)
    except BaseException as e:  # handed to whoever waits for the future
        _settle(future, error=e)
    else:
        _settle(future, value)
    if returned is not None:
        returned.set()


class CallThread:
    """Runs calls one at a time, in submit order; each has a deadline counted from its submit.

    One at a time as when rewards were called inline: a user's reward need not be thread-safe, nor
    fit in memory twice. Each call runs on a new daemon thread while the lane thread (started at
    the first call) waits for it until its deadline, then fails it and goes on: a stuck call keeps
    only its own thread. A call that could not start by its deadline never starts. Thread-local
    state (torch's grad mode, the current CUDA device) is not the caller's.

    :meth:`close` joins the threads whose calls returned: a daemon thread still tearing down (its
    frames' tensors, torch's thread-local state) when the interpreter finalizes is ended inside
    torch's C++ by ``pthread_exit``, which aborts the process ("terminate called without an active
    exception", pytorch/pytorch#38228): a finished run would exit with SIGABRT, not its code.
    """

    JOIN_S = 5.0
    """At most this long in :meth:`close` for the threads to end (they only have to unwind)."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue | None = None
        self._lane: threading.Thread | None = None
        self._callers: list[tuple[threading.Thread, threading.Event]] = []

    def submit(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> cf.Future:
        """Queue ``fn(*args)``; its future fails with :class:`DeadlineExceeded` ``timeout`` s from now."""
        future: cf.Future = cf.Future()
        with self._lock:
            if self._calls is None:
                self._calls = queue.SimpleQueue()
                self._lane = threading.Thread(
                    target=self._run, args=(self._calls,), name=self.name, daemon=True
                )
                self._lane.start()
            self._calls.put((future, fn, args, deadline_after(timeout)))
        return future

    def _run(self, calls: queue.SimpleQueue) -> None:
        while (item := calls.get()) is not None:
            try:
                self._watch(*item)
            except BaseException as e:  # no thread to be had, a wait too long for the OS: that call fails
                _settle(item[0], error=e)  # and the lane goes on (a dead lane would fail every later call)

    def _watch(self, future: cf.Future, fn: Callable[..., Any], args: tuple, deadline: float | None) -> None:
        if not future.set_running_or_notify_cancel():
            return
        left = seconds_left(deadline)
        if left == 0.0:
            _settle(future, error=DeadlineExceeded("not started by its deadline"))
            return
        returned = threading.Event()
        caller = threading.Thread(
            target=_call_into, args=(future, fn, args, returned), name=f"{self.name}-call", daemon=True
        )
        caller.start()
        with self._lock:
            self._callers = [(t, r) for t, r in self._callers if t.is_alive()] + [(caller, returned)]
        if not cf.wait([future], left).done:
            _settle(future, error=DeadlineExceeded("unfinished at its deadline"))

    def dead(self) -> bool:
        """Whether the lane thread has ended before :meth:`close` (then no call would run again;
        a reward server's ``/health`` reports it)."""
        with self._lock:
            return self._lane is not None and not self._lane.is_alive()

    def close(self) -> None:
        """End the lane thread once the calls queued now are done or overdue; wait (up to
        :attr:`JOIN_S`) for it and for the threads whose calls returned. A thread still inside a
        call that overran its deadline is left to itself: nothing can end it."""
        with self._lock:
            lane, self._lane = self._lane, None
            if self._calls is not None:
                self._calls.put(None)
                self._calls = None
        until = time.monotonic() + self.JOIN_S
        if lane is not None:
            lane.join(max(0.0, until - time.monotonic()))
        with self._lock:
            callers, self._callers = self._callers, []
        for thread, returned in callers:
            if returned.is_set():
                thread.join(max(0.0, until - time.monotonic()))


# ------------------------------------------------------------------------------------------------
# Worker processes
# ------------------------------------------------------------------------------------------------


def _init_worker(parent_pid: int, initializer: Callable[[], None] | None) -> None:
    die_with_parent(parent_pid)
    # a Ctrl-C in the terminal reaches the whole process group: the parent stops the run (after
    # the current step) and ends its workers itself; here it would only fail the job under way
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer()


class _Owner:
    """One long-lived thread that runs what it is given (see :class:`ProcessPool` for why)."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            _call_into(*item)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        future: cf.Future = cf.Future()
        self._calls.put((future, fn, args))
        return future.result()

    def stop(self) -> None:
        self._calls.put(None)


class Job:
    """One function call sent to a :class:`ProcessPool`; ``future`` is replaced when re-sent."""

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.future: cf.Future = cf.Future()
        self.generation = 0
        self.resends = 0

    def finished(self) -> bool:
        """Done with a result or with an error of its own (not one of the pool's)."""
        f = self.future
        return f.done() and not f.cancelled() and not isinstance(f.exception(), BrokenProcessPool)


class PoolCall:
    """The jobs of one :meth:`ProcessPool.map`; they share a deadline."""

    def __init__(self, pool: ProcessPool, jobs: list[Job], deadline: float | None):
        self.pool, self.jobs, self.deadline = pool, jobs, deadline
        self.expired = False
        self.timer: threading.Timer | None = None

    def result(self) -> list[Any]:
        """The jobs' results in order, what a job raised, or :class:`DeadlineExceeded`."""
        return self.pool.wait(self)


_LIVE_POOLS: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


# At interpreter exit concurrent.futures joins its pools' manager threads, which wait for the jobs
# in flight: one stuck job would hang the exit. Exit callbacks run last registered first, so this
# one kills the workers before that join (atexit itself runs only after it).
getattr(threading, "_register_atexit", lambda fn: None)(_close_live_pools)


class ProcessPool:
    """``num_workers`` spawned worker processes that die with this process, and deadlines.

    A call still unfinished at its deadline fails, and the workers are killed, since one of them
    is stuck on it (Python's pool cannot tell which, nor kill a single worker), then restarted.
    The unfinished jobs of other calls are re-sent to the new workers (at most
    :data:`MAX_RESENDS` times each) and keep their own deadlines; a pool broken by a worker that
    died is restarted in the same way.

    Workers are started from a thread of the pool's own that lives until :meth:`close`: Linux's
    ``PR_SET_PDEATHSIG`` fires when the *thread* that started a process exits, so a pool first
    used from a short-lived thread (a server's request thread, a reward's call thread) would
    otherwise lose its workers with that thread.
    """

    def __init__(self, num_workers: int, initializer: Callable[[], None] | None = None, name: str = "pool"):
        if num_workers < 1:
            raise ValueError(f"a process pool needs num_workers >= 1, got {num_workers}")
        self.num_workers, self.initializer, self.name = num_workers, initializer, name
        self._lock = threading.RLock()
        self._owner: _Owner | None = None
        self._executor: cf.ProcessPoolExecutor | None = None
        self._generation = 0
        self._unfinished: set[Job] = set()
        self._closed = False
        self.starts = 0
        """How often workers were started: at the first call (or :meth:`start`), then at each restart."""
        self.restarts = 0
        """How often the workers were killed and new ones started."""

    def start(self) -> None:
        """Start all the workers now, in the background, rather than at the first call: their
        start-up (spawning, importing, the initializer loading a model) then overlaps whatever this
        process does next (loading its own model, sampling), and the first call finds them ready
        or nearly so. Returns at once; a pool that has workers already is left as it is."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the {self.name} process pool is closed; make a new one")
            if self._executor is not None:
                return
            self._executor = self._new_executor()
            # one job per worker: the executor spawns a worker per job that finds none idle
            for _ in range(self.num_workers):
                self._owner_thread().call(self._executor.submit, os.getpid)

    def map(self, fn: Callable[..., Any], args: Sequence[tuple], timeout: float | None = None) -> PoolCall:
        """Send ``fn(*a)`` for each ``a`` in ``args`` to the workers (``fn`` importable by name:
        the workers are spawned), as one call that has ``timeout`` seconds from now."""
        call = PoolCall(self, [Job(fn, tuple(a)) for a in args], deadline_after(timeout))
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the {self.name} process pool is closed; make a new one")
            for job in call.jobs:
                self._send(job)
        if timeout is not None:  # the deadline is enforced when it passes, waited for or not
            call.timer = threading.Timer(timeout, self._expire, (call,))
            call.timer.daemon = True
            call.timer.start()
        return call

    def wait(self, call: PoolCall) -> list[Any]:
        """See :meth:`PoolCall.result`."""
        out = []
        try:
            for job in call.jobs:
                while True:  # once per future of the job: it may be re-sent while we wait
                    future, generation = job.future, job.generation
                    cf.wait([future], seconds_left(call.deadline))
                    with self._lock:
                        if not call.expired and not future.done() and job.future is future:
                            self._expire(call)  # the deadline passed before its timer fired
                        if call.expired:
                            raise DeadlineExceeded(f"{self.name} call unfinished at its deadline")
                        if job.future is not future:
                            continue
                        if not job.finished() and generation == self._generation and not self._closed:
                            self._restart()  # a worker died under it: fresh workers for every job
                            if job.future is not future:
                                continue
                        self._unfinished.discard(job)
                    out.append(future.result())  # or what the job raised
                    break
        finally:
            if call.timer is not None:
                call.timer.cancel()
        return out

    def _expire(self, call: PoolCall) -> None:
        """``call``'s deadline passed: fail it, and restart the workers if one still runs it."""
        with self._lock:
            if call.expired or all(job.finished() for job in call.jobs):
                return
            call.expired = True
            for job in call.jobs:
                self._unfinished.discard(job)  # failed: not to be re-sent
            if not self._closed:
                self._restart()

    def _send(self, job: Job) -> None:
        """Submit ``job`` to the current workers, starting them if there are none. Holds the lock."""
        owner = self._owner_thread()
        for attempt in range(2):
            if self._executor is None:
                self._executor = self._new_executor()
            try:  # on the owner thread: the executor starts its workers inside submit()
                job.future = owner.call(self._executor.submit, job.fn, *job.args)
                break
            except BrokenProcessPool:  # a worker died since the last job: start afresh
                if attempt:
                    raise
                self._restart()
        job.generation = self._generation
        self._unfinished.add(job)
        job.future.add_done_callback(lambda f, job=job: self._settle(job, f))

    def _owner_thread(self) -> _Owner:
        """The thread that starts the workers (made at the first use). Holds the lock."""
        if self._owner is None:
            self._owner = _Owner(f"{self.name}-pool-owner")
            _LIVE_POOLS.add(self)
        return self._owner

    def _new_executor(self) -> cf.ProcessPoolExecutor:
        """An executor for new workers (they start as jobs are submitted to it). Holds the lock."""
        self.starts += 1
        return cf.ProcessPoolExecutor(
            self.num_workers,
            mp.get_context("spawn"),  # fork would copy the locks of the trainer's other threads
            initializer=_init_worker,
            initargs=(os.getpid(), self.initializer),
        )

    def _settle(self, job: Job, future: cf.Future) -> None:
        # runs on the executor's thread, without the lock (which may wait on that thread);
        # set.discard is atomic
        if future is job.future and job.finished():
            self._unfinished.discard(job)

    def _restart(self) -> None:
        """Kill the workers; re-send the unfinished jobs to new ones. Holds the lock."""
        self._kill()
        self._generation += 1
        self.restarts += 1
        for job in list(self._unfinished):
            if job.finished():
                continue
            if job.resends >= MAX_RESENDS:
                self._unfinished.discard(job)  # its waiter gets the broken pool's error
                continue
            job.resends += 1
            self._send(job)

    def _kill(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        kill = getattr(executor, "kill_workers", None)  # Python >= 3.14
        if kill is not None:
            kill()
        else:  # the executor's own record of its workers (pid -> Process)
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                try:
                    process.kill()
                except (OSError, ValueError):  # gone already, or closed
                    pass
        executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Kill the workers (a stuck job must not keep one alive) and end the owner thread."""
        with self._lock:
            self._closed = True
            self._kill()
            self._unfinished.clear()
            if self._owner is not None:
                self._owner.stop()
                self._owner = None
            _LIVE_POOLS.discard(self)
