"""data.workers.WorkerPool: requests answered in any order of asking, errors raised where the
result is asked for, abandoned results discarded, a dead worker named in one error."""

import os
import signal
import time

import pytest

from bertfam_jax.data import workers

_STATE = {}


def remember(value):   # the initializer, in each worker
  _STATE["start"] = value


def add_start(x):
  return _STATE["start"] + x


def sleep_then(seconds, value):
  time.sleep(seconds)
  return value


def fail(message):
  raise ValueError(message)


class NotRebuilt(Exception):
  """Pickles, but cannot be rebuilt from its pickle (two arguments, one given back)."""

  def __init__(self, what, where):
    super().__init__(f"{what} at {where}")


def fail_unrebuildably():
  raise NotRebuilt("deep inside", "chunk 3")


def die():
  os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
def pool():
  discarded = []
  p = workers.WorkerPool(2, remember, (100,),
                         discard=lambda worker, result: discarded.append(result))
  yield p, discarded
  p.close()


def test_results_in_any_order_with_requests_of_two_streams_interleaved(pool):
  p, discarded = pool
  first = [p.submit(add_start, x) for x in range(6)]
  second = [p.submit(add_start, 10 + x) for x in range(4)]
  assert [r.result() for r in reversed(second)] == [113, 112, 111, 110]
  assert [r.result() for r in first] == [100 + x for x in range(6)]
  assert not discarded


def test_requests_go_to_the_worker_with_the_fewest_unanswered(pool):
  """Worker 1's answer arrived unread while worker 0 still computes: the next request goes to
  worker 1 (counting the unread answer as work, or taking turns, would give it to worker 0)."""
  p, _ = pool
  slow = p.submit(sleep_then, 5.0, "slow")
  first = p.submit(add_start, 1)
  assert (slow.worker, first.worker) == (0, 1)
  assert p._connections[1].poll(60)              # pylint: disable=protected-access  (unread)
  start = time.perf_counter()
  later = p.submit(add_start, 5)
  assert later.worker == 1 and later.result() == 105 and first.result() == 101
  assert time.perf_counter() - start < 4.0 and slow.result() == "slow"


def test_an_error_is_raised_where_its_result_is_asked_for_and_the_pool_goes_on(pool):
  p, _ = pool
  failing, fine = p.submit(fail, "bad chunk"), p.submit(add_start, 1)
  assert fine.result() == 101
  with pytest.raises(ValueError, match="bad chunk"):
    failing.result()
  with pytest.raises(RuntimeError, match="NotRebuilt: deep inside at chunk 3"):
    p.submit(fail_unrebuildably).result()
  assert p.submit(add_start, 2).result() == 102


def test_abandoned_results_are_discarded_whether_answered_yet_or_not(pool):
  p, discarded = pool
  requests = [p.submit(add_start, x) for x in range(4)]
  assert requests[3].result() == 103          # some of 0, 1 and 2 are answered by now
  for r in requests[:3]:
    r.abandon()
  assert set(discarded) <= {100, 101, 102}
  requests[2].abandon()                        # twice is harmless
  p.submit(add_start, 7).abandon()
  assert p.submit(add_start, 8).result() == 108
  p.close()                                    # waits for the answers out, discarding them
  assert sorted(discarded) == [100, 101, 102, 107]


def test_a_dead_worker_is_one_error_naming_it_and_the_pool_still_closes():
  """A worker killed with requests queued: each of its requests raises one RuntimeError naming
  it, the other worker goes on, close() ends both without raising, and reap runs once each."""
  reaped = []
  p = workers.WorkerPool(2, remember, (0,), reap=reaped.append)
  pid = p.pids[0]
  busy = [p.submit(sleep_then, 1.0, "slept") for _ in range(2)]       # one on each worker
  added = [p.submit(add_start, x) for x in range(4)]                  # queued behind, in turn
  doomed = [r for r in busy + added if r.worker == 0]
  assert len(doomed) == 3                          # the sleep and two queued requests
  os.kill(pid, signal.SIGKILL)
  for request in doomed:
    with pytest.raises(RuntimeError, match=f"Data worker process {pid} ended .*data.workers=0"):
      request.result()
  survivors = [(x, r) for x, r in enumerate(added) if r.worker == 1]
  assert len(survivors) == 2 and all(r.result() == x for x, r in survivors)   # worker 1 goes on
  assert p.submit(add_start, 9).result() == 9
  with pytest.raises(RuntimeError, match="read already"):
    survivors[0][1].result()
  with pytest.raises(RuntimeError, match="read already"):
    doomed[0].result()
  p.close()
  assert not any(process.is_alive() for process in p._processes)  # pylint: disable=protected-access
  assert sorted(reaped) == sorted(p.pids)


def test_workers_ignore_ctrl_c_and_clean_up_when_terminated(tmp_path):
  goodbye = str(tmp_path / "goodbye")
  p = workers.WorkerPool(1, remember, (goodbye,), finalizer=say_goodbye)
  os.kill(p.pids[0], signal.SIGINT)               # Ctrl-C reaches the whole process group
  time.sleep(0.2)
  os.kill(p.pids[0], signal.SIGINT)               # and once it runs its loop
  assert p.submit(sleep_then, 0.2, "still here").result() == "still here"
  p._processes[0].terminate()                    # pylint: disable=protected-access
  p._processes[0].join()                         # pylint: disable=protected-access
  with open(goodbye, encoding="utf-8") as f:    # the finalizer ran on SIGTERM
    assert f.read() == "done"
  p.close()


def note(value):
  _STATE.setdefault("notes", []).append(value)


def notes():
  return _STATE.get("notes", [])


def say_goodbye():
  with open(_STATE["start"], "w", encoding="utf-8") as f:
    f.write("done")


def test_notify_runs_before_later_requests_and_the_finalizer_at_the_end(tmp_path):
  goodbye = str(tmp_path / "goodbye")
  p = workers.WorkerPool(1, remember, (goodbye,), finalizer=say_goodbye)
  p.notify(0, note, "first")
  p.notify(0, note, "second")
  assert p.submit(notes).result() == ["first", "second"]
  p.close()
  with open(goodbye, encoding="utf-8") as f:
    assert f.read() == "done"
