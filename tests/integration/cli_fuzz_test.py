"""The command line fuzzed: generated bad input, each expected to end in exit 2, one line on
stderr naming the field or file, and a workdir left as it was (not created, or byte for byte the
finished run it held).

The cases come from a seeded generator (`_cases`, CASES of them, the same on every machine) over
the config's own tables, so a field added with a rule is fuzzed without touching this file:
  wrong types      any number or flag of the paper config given text it cannot parse;
  out of range     every `config_lib.FIELD_RULES` / objective FIELD_RULES range, just outside
                   each finite end, and NaN / ±inf;
  unknown choices  every field whose rule is a tuple of choices;
  huge sizes       widths, depths, vocabularies, batches and lengths of 10^9..10^15, refused by
                   the memory floor or the length checks before any allocation;
  files            empty, binary, blank, missing and directory corpora and tokenizers, an
                   init_from that holds no checkpoint;
  workdirs         a file, a path under a file, an unwritable place.
`test_every_field_has_a_rule` keeps the tables complete: a number or choice added to a paper
config without a rule fails it.
"""

import hashlib
import importlib.util
import math
import os
import random
import subprocess
import sys

import pytest

from bertfam_jax import config_lib, objectives

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONFIG = "configs/roberta.py:runlocal"
_TINY = ("--config.model.hidden=32", "--config.model.layers=2", "--config.model.heads=2",
         "--config.model.mlp=64", "--config.model.vocab_size=512",
         "--config.model.max_positions=32", "--config.data.seq_len=32",
         "--config.objective.max_predictions=5", "--config.train.batch_size=8",
         "--config.optimizer.warmup_steps=1", "--config.train.total_steps=2",
         "--config.train.checkpoint_every=2", "--config.train.eval_every=2")
CASES = 64
_SEED = 20261125
# Strings that name things checked where they are used (a file, a dataset, a split), not by a rule.
_FREE_FORM = {"data.cache_dir", "data.text_files", "data.tfds_name", "data.tfds_data_dir",
              "data.tfds_text_key", "data.train_split", "data.eval_split", "tokenizer.model_path",
              "tokenizer.user_symbols", "train.init_from", "objective.name",
              # checked where they are parsed, with the field named (config_lib.validate_tracking)
              "train.metric_writers", "train.profile_steps", "train.wandb_project"}
_HUGE_FIELDS = ("model.hidden", "model.layers", "model.mlp", "model.vocab_size",
                "model.max_positions", "train.batch_size", "data.seq_len")


def _paper_config(name="roberta", arg="runlocal"):
  spec = importlib.util.spec_from_file_location(name, os.path.join(_REPO, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _leaves(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _rules(config):
  return {**config_lib.FIELD_RULES,
          **objectives.field_rules(objectives.get(config.objective.name))}


def _outside(rule: config_lib.Range, is_int: bool) -> list[str]:
  """Values just outside `rule`'s finite ends, and the non-finite ones a float field parses."""
  values = []
  if math.isfinite(rule.low):
    values.append(rule.low if rule.low_open else rule.low - (1 if is_int else 0.5))
  if math.isfinite(rule.high):
    values.append(rule.high if rule.high_open else rule.high + (1 if is_int else 0.5))
  if is_int and math.isfinite(rule.low):
    values.append(int(rule.low) - 10**9)
  if not is_int:
    values += ["nan", "inf", "-inf"]
  return [str(int(v)) if is_int and not isinstance(v, str) else str(v) for v in values]


def _cases(files) -> list[tuple[str, tuple[str, ...], bool]]:
  """(case id, arguments, whether it runs on the finished workdir) for CASES seeded cases."""
  config = _paper_config()
  leaves = dict(_leaves(config))
  rules = _rules(config)
  pools = {"wrong type": [], "out of range": [], "unknown choice": [], "huge": [], "files": []}
  for path, value in leaves.items():
    if isinstance(value, bool):
      pools["wrong type"].append((f"--config.{path}=maybe",))
    elif isinstance(value, (int, float)):
      pools["wrong type"] += [(f"--config.{path}=abc",)] + (
          [(f"--config.{path}=1.5",)] if isinstance(value, int) else [])
    rule = rules.get(path)
    if isinstance(rule, config_lib.Range):
      pools["out of range"] += [(f"--config.{path}={v}",)
                                for v in _outside(rule, isinstance(value, int))]
    elif isinstance(rule, tuple):
      pools["unknown choice"].append((f"--config.{path}=no_such_{path.split('.')[-1]}",))
  pools["huge"] = [(f"--config.{path}={10**k}",) for path in _HUGE_FIELDS for k in (9, 12, 15)]
  text = ("--config.data.source=text",)
  pools["files"] = [
      (*text, f"--config.data.text_files={files['empty']}"),
      (*text, f"--config.data.text_files={files['blank']}"),
      (*text, f"--config.data.text_files={files['binary']}"),
      (*text, f"--config.data.text_files={files['directory']}"),
      (*text, f"--config.data.text_files={files['missing']}"),
      (f"--config.tokenizer.model_path={files['binary']}",),
      (f"--config.tokenizer.model_path={files['empty']}",),
      (f"--config.tokenizer.model_path={files['missing']}",),
      (f"--config.tokenizer.model_path={files['directory']}",),
      (f"--config.train.init_from={files['binary']}",),
      (f"--config.train.init_from={files['directory']}",),
      (f"--config.train.init_from={files['missing']}",),
  ]
  rng = random.Random(_SEED)
  cases = []
  for kind in pools:   # every kind, then the rest drawn across all pools
    pools[kind] = sorted(pools[kind])
    rng.shuffle(pools[kind])
  quota = {"files": len(pools["files"])}
  rest = CASES - 3 - sum(quota.values())     # 3 workdir cases
  others = [k for k in pools if k not in quota]
  for i, kind in enumerate(others):
    quota[kind] = rest // len(others) + (i < rest % len(others))
  for kind, count in quota.items():
    for args in pools[kind][:count]:
      # Files and init_from only matter for a fresh run; the rest also on the finished one.
      cases.append((f"{kind}: {' '.join(a.split('--config.')[-1] for a in args)}", args,
                    kind != "files" and len(cases) % 2 == 0))
  return cases


def _digest(root):
  out = {}
  for dirpath, _, names in os.walk(root):
    for name in names:
      with open(os.path.join(dirpath, name), "rb") as f:
        out[os.path.relpath(os.path.join(dirpath, name), root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _run(workdir, *args, timeout=180):
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, env.get("PYTHONPATH")]))
  return subprocess.run([sys.executable, "-m", "bertfam_jax.main", f"--config={_CONFIG}",
                         f"--workdir={workdir}", *_TINY, *args], cwd=_REPO, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)


_FILES_ROOT = os.path.join(os.environ.get("BERTFAM_FUZZ_FILES", "/tmp"),
                           f"bertfam_fuzz_files_{os.getuid()}")
_FILES = dict(empty=os.path.join(_FILES_ROOT, "empty.txt"),
              blank=os.path.join(_FILES_ROOT, "blank.txt"),
              binary=os.path.join(_FILES_ROOT, "binary.txt"),
              directory=os.path.join(_FILES_ROOT, "a_directory"),
              missing=os.path.join(_FILES_ROOT, "missing.txt"))
_GENERATED = _cases(_FILES)


def _write_files():
  os.makedirs(_FILES["directory"], exist_ok=True)
  with open(_FILES["empty"], "wb"):
    pass
  with open(_FILES["blank"], "wb") as f:
    f.write(b"\n  \n\t\n")
  with open(_FILES["binary"], "wb") as f:
    f.write(bytes(range(256)) * 8)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished 2-step run, which every case on it must leave byte for byte as it was."""
  _write_files()
  workdir = str(tmp_path_factory.mktemp("finished") / "run")
  result = _run(workdir, timeout=400)
  assert result.returncode == 0, result.stderr[-2000:]
  return workdir


def _assert_one_line_exit_2(result, case):
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, f"{case}: exit {result.returncode}\n{result.stderr[-3000:]}"
  assert len(lines) == 1 and lines[0].startswith("error: "), f"{case}:\n{result.stderr[-3000:]}"


# The cases' ids (file paths relative to the files' root) and workdirs, hashed: the same cases on
# every machine and every Python. A change of the rules or the paper config changes them: check
# the new cases, then update the pin.
_PINNED = "e7d4782795962df7"


def test_the_generator_draws_every_kind_and_the_same_cases_everywhere():
  """CASES cases in all (3 of them workdirs), every kind of bad input among them."""
  kinds = {case.split(":")[0] for case, _, _ in _GENERATED}
  assert len(_GENERATED) + 3 == CASES and len({case for case, _, _ in _GENERATED}) == len(_GENERATED)
  assert kinds == {"wrong type", "out of range", "unknown choice", "huge", "files"}
  ids = "\n".join(f"{case.replace(_FILES_ROOT, '<files>')} {on_finished}"
                   for case, _, on_finished in _GENERATED)
  assert hashlib.sha256(ids.encode()).hexdigest()[:16] == _PINNED


@pytest.mark.parametrize("case, args, on_finished", _GENERATED, ids=[c[0] for c in _GENERATED])
def test_fuzzed_override(case, args, on_finished, finished, tmp_path):
  workdir = finished if on_finished else str(tmp_path / "never")
  before = _digest(workdir) if on_finished else None
  result = _run(workdir, *args)
  _assert_one_line_exit_2(result, case)
  if on_finished:
    assert _digest(workdir) == before, case
  else:
    assert not os.path.exists(workdir), case


@pytest.mark.parametrize("make", ["a file", "under a file", "unwritable"])
def test_fuzzed_workdir(make, tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  workdir = {"a file": blocker, "under a file": blocker / "run",
             "unwritable": "/proc/bertfam_fuzz/run"}[make]
  result = _run(str(workdir))
  _assert_one_line_exit_2(result, make)
  assert blocker.read_text() == "x"


@pytest.mark.parametrize("arg", ["", "runlocal"])
@pytest.mark.parametrize("paper", ["bert", "roberta", "albert", "spanbert", "structbert",
                                   "electra", "t5", "xlnet", "gpt", "unilm"])
def test_every_field_has_a_rule(paper, arg):
  """Every number and choice of every paper's config (its recipe and :runlocal) has a range or a
  list of choices (or is a named free-form string), so that the validation pass covers it and
  the fuzz draws from it; and the recipe itself passes them."""
  config = _paper_config(paper, arg)
  objectives.validate(config)
  rules = _rules(config)
  missing = [path for path, value in _leaves(config)
             if not isinstance(value, bool) and path not in rules and path not in _FREE_FORM]
  assert not missing, f"{paper}: fields without a rule in config_lib.FIELD_RULES or the " \
                      f"objective's FIELD_RULES: {missing}"
