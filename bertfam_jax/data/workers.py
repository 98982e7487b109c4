"""Worker processes for the host pipeline, each with its own pipe, and no thread in the parent.

`concurrent.futures.ProcessPoolExecutor` hands every task and result through two more threads of
the parent (the executor's manager and its queue's feeder), and on a host whose cores the workers
keep busy, waking them cost the training process about a quarter of a core (docs/results.md,
"Worker processes"). Here a request goes to the worker with the fewest requests unanswered
(answers already sent are read first; the first such worker on a tie) over that worker's own
duplex pipe, each worker answers its requests in order, and the parent reads an answer only when
it asks for that result or picks a worker, in the thread that asks. Which worker computes a
request depends on timing; what it computes does not. Several streams may have requests out at
once (training batches and evaluation batches): answers that arrive for another request wait in
a dict, and the answers of abandoned requests are handed to `discard`. `notify` runs a function
in one worker without an answer (the pipeline hands segments back with it).
"""

from __future__ import annotations

import itertools
import multiprocessing
from typing import Any, Callable


def _serve(connection, initializer: Callable, initargs: tuple,
           finalizer: Callable[[], None] | None) -> None:
  """A worker's loop: (request id, function, args) in, (request id, ok, result or error) out,
  (None, function, args) run without an answer, until None or the parent's end of the pipe
  closes; then `finalizer()`."""
  initializer(*initargs)
  try:
    while True:
      try:
        request = connection.recv()
      except EOFError:
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
        answer = (request_id, False, e)
      try:
        connection.send(answer)
      except Exception as e:  # pylint: disable=broad-except  (an error that cannot be pickled)
        connection.send((request_id, False, RuntimeError(f"{type(answer[2]).__name__}: "
                                                         f"{answer[2]} ({e})")))
  finally:
    if finalizer is not None:
      finalizer()


class Request:
  """One request's result, when the parent asks for it (`result`), or never (`abandon`)."""

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
  the results of abandoned requests.

  Example:
    pool = WorkerPool(2, start, (pipeline,))
    requests = [pool.submit(make_chunk, epoch, chunk, shard) for chunk in range(4)]
    examples = requests[0].result()
    pool.close()
  """

  def __init__(self, count: int, initializer: Callable, initargs: tuple, *,
               finalizer: Callable[[], None] | None = None,
               discard: Callable[[int, Any], None] = lambda worker, result: None):
    context = multiprocessing.get_context("spawn")
    self._discard = discard
    self._connections, self._processes = [], []
    for _ in range(count):
      ours, theirs = context.Pipe()
      process = context.Process(target=_serve, args=(theirs, initializer, initargs, finalizer),
                                daemon=True)
      process.start()
      theirs.close()
      self._connections.append(ours)
      self._processes.append(process)
    self._ids = itertools.count()
    self._worker_of: dict[int, int] = {}        # requests sent and not yet answered
    self._answered: dict[int, tuple[bool, Any, int]] = {}   # ok, value, worker
    self._abandoned: set[int] = set()

  @property
  def pids(self) -> list[int]:
    return [process.pid for process in self._processes]

  def submit(self, function: Callable, *args) -> Request:
    """Sends `function(*args)` to the least busy worker (`function` a module-level name): the
    one with the fewest requests still unanswered, once every answer already sent is read."""
    request_id = next(self._ids)
    for worker, connection in enumerate(self._connections):
      while worker in self._worker_of.values() and connection.poll():
        self._receive(worker)
    busy = [0] * len(self._connections)
    for w in self._worker_of.values():
      busy[w] += 1
    worker = busy.index(min(busy))
    self._connections[worker].send((request_id, function, args))
    self._worker_of[request_id] = worker
    return Request(self, request_id, worker)

  def notify(self, worker: int, function: Callable, *args) -> None:
    """Runs `function(*args)` in worker `worker`, before its later requests, with no answer."""
    self._connections[worker].send((None, function, args))

  def _receive(self, worker: int) -> None:
    try:
      request_id, ok, value = self._connections[worker].recv()
    except EOFError:
      process = self._processes[worker]
      process.join(timeout=1)
      for request_id in [r for r, w in self._worker_of.items() if w == worker]:
        del self._worker_of[request_id]   # never answered: close() waits for them no more
        self._abandoned.discard(request_id)
      raise RuntimeError(f"Data worker process {process.pid} ended (exit code "
                         f"{process.exitcode}) with requests unanswered; see its output above, "
                         f"or set --config.data.workers=0.") from None
    del self._worker_of[request_id]
    if request_id in self._abandoned:
      self._abandoned.remove(request_id)
      if ok:
        self._discard(worker, value)
    else:
      self._answered[request_id] = (ok, value, worker)

  def _result(self, request_id: int) -> Any:
    while request_id not in self._answered:
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
    for request_id in list(self._worker_of):
      self._abandon(request_id)
    for request_id in list(self._answered):
      self._abandon(request_id)
    try:
      while self._worker_of:
        self._receive(next(iter(self._worker_of.values())))
    finally:
      for connection, process in zip(self._connections, self._processes):
        try:
          connection.send(None)
        except OSError:
          pass
        connection.close()
        process.join(timeout=10)
        if process.is_alive():
          process.terminate()
          process.join()
