"""The one loop (`train/loop.py`) with a counting step in place of a model: fine-tuning's epoch
batches, what is logged, evaluated and saved at which step, the non-finite stop naming the steps
of its window (a resumed run's too), preemption saving before any evaluation, and a finished
run doing nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax.train import loop, sharding, step as step_lib

ONE = jnp.ones([], jnp.float32)


def mesh():
  return sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])


def counting_step(nan_from: int | None = None):
  """`step(state, batch)`: adds 1 to the step; its loss is the batch's mean row id, NaN from
  step `nan_from` (1-based) on."""
  def step(state, batch):
    number = state.step + 1
    loss = jnp.mean(batch["row"].astype(jnp.float32))
    if nan_from is not None:
      loss = jnp.where(number >= nan_from, jnp.nan, loss)
    return state.replace(step=number), dict(loss=(loss, ONE), learning_rate=(ONE, ONE))
  return step


class Recorder:
  """The sinks' checkpointer: saves are recorded (step, data position), nothing is written."""

  def __init__(self):
    self.saved = []

  def save(self, step, state, data_state):
    self.saved.append((step, dict(data_state)))

  def latest_step(self):
    return self.saved[-1][0] if self.saved else None


def state_at(step: int):
  return step_lib.TrainState(step=jnp.asarray(step, jnp.int32), params={}, opt_state=())


def test_epoch_order_permutes_every_epoch_and_drops_the_remainder():
  first = np.concatenate([loop.epoch_order(10, 4, 0, s) for s in (0, 1)])
  second = np.concatenate([loop.epoch_order(10, 4, 0, s) for s in (2, 3)])
  for epoch in (first, second):
    assert len(set(epoch.tolist())) == 8   # two full batches of distinct rows, 2 left out
  assert first.tolist() != second.tolist()
  assert loop.epoch_order(10, 4, 1, 0).tolist() != loop.epoch_order(10, 4, 0, 0).tolist()


def test_epoch_source_resumes_where_its_state_says():
  data = dict(row=np.arange(10))
  source = loop.EpochSource(data, 4, seed=3)
  batches = [next(source)["row"].tolist() for _ in range(5)]
  assert source.state() == {"step": 5}
  resumed = loop.EpochSource(data, 4, seed=3)
  resumed.restore([{"step": 2}])
  assert [next(resumed)["row"].tolist() for _ in range(3)] == batches[2:]


def test_logs_evaluates_and_saves_on_schedule(capsys):
  recorder, evaluated = Recorder(), []
  evaluator = loop.Evaluator(3, lambda step, params: evaluated.append(step) or {"score": step})
  state, last = loop.train(
      state_at(0), counting_step(), loop.EpochSource(dict(row=np.arange(8)), 2, seed=0),
      mesh=mesh(), total_steps=7, log_every=2, checkpoint_every=3, tokens_per_step=2,
      evaluators=[evaluator], sinks=loop.Sinks(checkpointer=recorder))
  assert int(state.step) == 7 and evaluated == [3, 6, 7]
  assert recorder.saved == [(3, {"step": 3}), (6, {"step": 6}), (7, {"step": 7})]
  assert last["eval_score"] == 7 and np.isfinite(last["loss"])
  summary = capsys.readouterr().out.strip().splitlines()[-1]
  assert summary.startswith("Finished at step 7/7 in ") and "last eval: score 7.0000." in summary


@pytest.mark.parametrize("start", [0, 3])
def test_a_non_finite_loss_names_the_steps_of_its_window(start):
  """Logged every 5 steps: a NaN at step 5 is found at the log of step 5, in the window that
  began after the last log (a resumed run's: after the step it resumed from)."""
  recorder = Recorder()
  with pytest.raises(loop.NonFiniteLossError,
                     match=f"between steps {start + 1} and 5; no checkpoint was written"):
    loop.train(state_at(start), counting_step(nan_from=5),
               loop.EpochSource(dict(row=np.arange(8)), 2, seed=0, step=start), mesh=mesh(),
               total_steps=10, log_every=5, checkpoint_every=100, tokens_per_step=2,
               sinks=loop.Sinks(checkpointer=recorder))
  assert recorder.saved == []


def test_preemption_saves_before_evaluating(monkeypatch, capsys):
  recorder, evaluated = Recorder(), []
  monkeypatch.setattr(loop.preemption.Watch, "reached", lambda self, step: step == 4)
  state, _ = loop.train(
      state_at(0), counting_step(), loop.EpochSource(dict(row=np.arange(8)), 2, seed=0),
      mesh=mesh(), total_steps=8, log_every=1, checkpoint_every=100, tokens_per_step=2,
      evaluators=[loop.Evaluator(2, lambda step, p: evaluated.append(step) or {})],
      sinks=loop.Sinks(checkpointer=recorder))
  assert int(state.step) == 4 and recorder.saved == [(4, {"step": 4})] and evaluated == [2]
  assert "Stopped at step 4/8" in capsys.readouterr().out


def test_a_finished_run_runs_nothing(capsys):
  state, last = loop.train(state_at(5), counting_step(), iter(()), mesh=mesh(), total_steps=5,
                           log_every=1, checkpoint_every=1, tokens_per_step=2)
  assert int(state.step) == 5 and last == {}
  assert "Already finished at step 5" in capsys.readouterr().out


def test_throughput_and_eta_count_training_steps_only(monkeypatch, capsys):
  """On a fake clock: every step takes 1 s, steps 11-15 take 10 s, and the evaluation at step 4
  takes 1,000 s. The first log (a window of only the compiling step) shows no throughput rather
  than `nan tok/s`; the window after the evaluation reports the steps' own speed; the ETA follows
  the smoothed step time, so five slow steps move it by a fraction, not tenfold."""
  clock = [0.0]
  monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
  counting = counting_step()

  def timed_step(state, batch):
    clock[0] += 10.0 if 11 <= int(state.step) + 1 <= 15 else 1.0
    return counting(state, batch)

  slow_evaluation = loop.Evaluator(4, lambda step, params: clock.__setitem__(0, clock[0] + 1e3)
                                   or {})
  loop.train(state_at(0), timed_step, loop.EpochSource(dict(row=np.arange(64)), 2, seed=0),
             mesh=mesh(), total_steps=30, log_every=1, checkpoint_every=100,
             tokens_per_step=2000, evaluators=[slow_evaluation])
  lines = {int(line.split("/")[0].split()[1]): line
           for line in capsys.readouterr().out.splitlines() if line.startswith("step ")}

  def field(step, unit):
    return next(p for p in lines[step].split(" | ") if p.endswith(unit) or p.startswith(unit))

  assert "tok/s" not in lines[1] and "nan" not in lines[1] and "ETA" not in lines[1]
  assert field(2, "tok/s") == "2.0k tok/s" and field(2, "ETA") == "ETA 0m28s"
  assert field(5, "tok/s") == "2.0k tok/s"      # the 1,000 s evaluation is not counted
  assert field(11, "tok/s") == "0.2k tok/s"     # a slow window is reported as it is
  eta = int(field(15, "ETA")[len("ETA 0m"):-1])
  assert 15 < eta < 22                          # 15 steps left: 150 s at the slow window's pace
