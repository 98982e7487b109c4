"""Worker processes for the host pipeline, each with its own pipe, and no thread in the parent.

`concurrent.futures.ProcessPoolExecutor` hands every task and result through two more threads of
the parent (the executor's manager and its queue's feeder), and on a host whose cores the workers
keep busy, waking them cost the training process about a quarter of a core (docs/results.md,
"Worker processes"). Here a request goes to the worker with the fewest requests unanswered
(answers already sent are read first; ties in turn) over that worker's own duplex pipe, each
worker answers its requests in order, and the parent reads an answer only when it asks for that
result or picks a worker, in the thread that asks. Which worker computes a request depends on
timing; what it computes does not. Several streams may have requests out at once (training
batches and evaluation batches): answers that arrive for another request wait in a dict, and the
answers of abandoned requests are handed to `discard`. `notify` runs a function in one worker
without an answer (the pipeline hands segments back with it). Requests and their arguments must
be small (a worker sending a large answer does not read its pipe meanwhile).

Workers ignore Ctrl-C (the parent's KeyboardInterrupt ends them through `close`) and run their
`finalizer` when they end, on SIGTERM too (multiprocessing terminates daemonic children at the
parent's exit). A worker that died is one RuntimeError naming it, and `reap(pid)` runs in the
parent for each worker once it has ended, dead or closed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import signal
import threading
from typing import Any, Callable


@contextlib.contextmanager
def _ctrl_c_ignored():
  """SIGINT ignored while a worker is spawned (main thread only: elsewhere it cannot be set)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)


def _raise_exit(signum, frame):
  raise SystemExit(128 + signum)


def _portable(error: BaseException) -> BaseException:
  """`error`, or a RuntimeError with its text where it would not come back from pickling (the
  parent could not rebuild it and would lose the answer)."""
  try:
    pickle.loads(pickle.dumps(error))
    return error
  except Exception:  # pylint: disable=broad-except
    return RuntimeError(f"{type(error).__name__}: {error}")


def _serve(connection, initializer: Callable, initargs: tuple,
           finalizer: Callable[[], None] | None) -> None:
  """A worker's loop: (request id, function, args) in, (request id, ok, result or error) out,
  (None, function, args) run without an answer, until None or the parent's end of the pipe
  closes; then `finalizer()`."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, _raise_exit)
  try:
    initializer(*initargs)
    while True:
      try:
        request = connection.recv()
      except (EOFError, OSError):
        return
      if request is None:
        return
      request_id, function, args = request
      if request_id is None:
        function(*args)
        continue
      try:
        answer = (request_id, True, function(*args))
      except Exception as e:  # pylint: disable=broad-except  (raised again in the parent)
        answer = (request_id, False, _portable(e))
      try:
        connection.send(answer)
      except (BrokenPipeError, ConnectionResetError):
        return
  finally:
    if finalizer is not None:
      finalizer()


class Request:
  """One request's result, when the parent asks for it (`result`, once), or never (`abandon`)."""

  def __init__(self, pool: "WorkerPool", request_id: int, worker: int):
    self._pool, self._id = pool, request_id
    self.worker = worker   # the index of the worker that answers it

  def result(self) -> Any:
    """The function's return value; its exception is raised here."""
    return self._pool._result(self._id)  # pylint: disable=protected-access

  def abandon(self) -> None:
    """The result will not be asked for: `discard` gets it when it arrives."""
    self._pool._abandon(self._id)  # pylint: disable=protected-access


class WorkerPool:
  """`count` spawned processes, each started with `initializer(*initargs)`, computing
  `function(*args)` for `submit`, and ending with `finalizer()`; `discard(worker, result)` gets
  the results of abandoned requests, `reap(pid)` runs once a worker has ended.

  Example:
    pool = WorkerPool(2, start, (pipeline,))
    requests = [pool.submit(make_chunk, epoch, chunk, shard) for chunk in range(4)]
    examples = requests[0].result()
    pool.close()
  """

  def __init__(self, count: int, initializer: Callable, initargs: tuple, *,
               finalizer: Callable[[], None] | None = None,
               discard: Callable[[int, Any], None] = lambda worker, result: None,
               reap: Callable[[int], None] = lambda pid: None):
    context = multiprocessing.get_context("spawn")
    self._discard, self._reap = discard, reap
    self._connections, self._processes = [], []
    for _ in range(count):
      ours, theirs = context.Pipe()
      process = context.Process(target=_serve, args=(theirs, initializer, initargs, finalizer),
                                daemon=True)
      with _ctrl_c_ignored():   # inherited: a Ctrl-C while the worker starts does not end it
        process.start()
      theirs.close()
      self._connections.append(ours)
      self._processes.append(process)
    self._next_id = 0
    self._turn = 0                               # where the next tie starts
    self._worker_of: dict[int, int] = {}        # requests sent and not yet answered
    self._answered: dict[int, tuple[bool, Any, int]] = {}   # ok, value, worker
    self._abandoned: set[int] = set()
    self._dead: set[int] = set()

  @property
  def pids(self) -> list[int]:
    return [process.pid for process in self._processes]

  def _died(self, worker: int) -> None:
    """Marks `worker` dead and answers its requests with the error naming it."""
    process = self._processes[worker]
    if worker not in self._dead:
      self._dead.add(worker)
      process.join(timeout=1)
      self._reap(process.pid)
    error = RuntimeError(f"Data worker process {process.pid} ended (exit code "
                         f"{process.exitcode}) with requests unanswered; see its output above, "
                         f"or set --config.data.workers=0.")
    for request_id in [r for r, w in self._worker_of.items() if w == worker]:
      del self._worker_of[request_id]
      if request_id in self._abandoned:
        self._abandoned.remove(request_id)
      else:
        self._answered[request_id] = (False, error, worker)

  def submit(self, function: Callable, *args) -> Request:
    """Sends `function(*args)` to the least busy live worker (`function` a module-level name):
    the one with the fewest requests still unanswered, once every answer already sent is
    read."""
    for worker, connection in enumerate(self._connections):
      while worker in self._worker_of.values() and connection.poll():
        self._receive(worker)
    busy = {w: 0 for w in range(len(self._connections)) if w not in self._dead}
    if not busy:
      raise RuntimeError("Every data worker process has ended; see their output above, or set "
                         "--config.data.workers=0.")
    for w in self._worker_of.values():
      busy[w] += 1
    fewest = min(busy.values())
    order = sorted(busy, key=lambda w: (w - self._turn) % len(self._connections))
    worker = next(w for w in order if busy[w] == fewest)
    self._turn = worker + 1
    request_id, self._next_id = self._next_id, self._next_id + 1
    self._worker_of[request_id] = worker
    try:
      self._connections[worker].send((request_id, function, args))
    except OSError:
      self._died(worker)   # the request's answer is the error
    return Request(self, request_id, worker)

  def notify(self, worker: int, function: Callable, *args) -> None:
    """Runs `function(*args)` in worker `worker`, before its later requests, with no answer
    (nothing, if the worker has died). `function` must not raise."""
    if worker in self._dead:
      return
    try:
      self._connections[worker].send((None, function, args))
    except OSError:
      self._died(worker)

  def _receive(self, worker: int) -> None:
    """Reads one answer of `worker` (or finds it dead: its requests' answers are the error)."""
    try:
      request_id, ok, value = self._connections[worker].recv()
    except (EOFError, OSError):
      self._died(worker)
      return
    del self._worker_of[request_id]
    if request_id in self._abandoned:
      self._abandoned.remove(request_id)
      if ok:
        self._discard(worker, value)
    else:
      self._answered[request_id] = (ok, value, worker)

  def _result(self, request_id: int) -> Any:
    while request_id not in self._answered:
      if request_id not in self._worker_of:
        raise RuntimeError(f"Request {request_id}'s result was read already, or abandoned.")
      self._receive(self._worker_of[request_id])
    ok, value, _ = self._answered.pop(request_id)
    if not ok:
      raise value
    return value

  def _abandon(self, request_id: int) -> None:
    if request_id in self._answered:
      ok, value, worker = self._answered.pop(request_id)
      if ok:
        self._discard(worker, value)
    elif request_id in self._worker_of:
      self._abandoned.add(request_id)

  def close(self) -> None:
    """Waits for the requests out (their results discarded) and ends the workers."""
    try:
      for request_id in list(self._worker_of) + list(self._answered):
        self._abandon(request_id)
      while self._worker_of:
        self._receive(next(iter(self._worker_of.values())))
      self._answered.clear()   # dead workers' errors nobody asked for
    finally:
      for worker, (connection, process) in enumerate(zip(self._connections, self._processes)):
        try:
          connection.send(None)
        except OSError:
          pass
        connection.close()
        process.join(timeout=10)
        if process.is_alive():
          process.terminate()
          process.join()
        if worker not in self._dead:
          self._reap(process.pid)
