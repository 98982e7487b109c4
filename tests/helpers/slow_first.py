"""A pytest plugin: the slowest test files are collected first, so that on the xdist workers
(`--dist loadfile --no-loadscope-reorder`, setup.cfg) they start first and the run does not end
with a worker idle while another works through a long file. xdist's default order, files by
their number of tests, started the few-but-long files last: `multiprocess_test.py` (3 tests,
300 s) was among the last to start. tests/conftest.py loads it.

SLOWEST is the files' worker time in a 2-core run of the suite at e9f0622 (per-test wall times,
summed by file), with the four files shortened since (xlnet_pretrain, seq2seq, masking_schemes,
t5_objectives) placed by estimate, descending, down to ~40 s; a file not listed keeps its place
in the collection, after them. A stale list costs time, never a result."""

SLOWEST = (
    "integration/finetune_run_test.py",
    "integration/multiprocess_test.py",
    "train/step_test.py",
    "integration/main_test.py",
    "objectives/electra_objective_test.py",
    "train/train_test.py",
    "integration/cli_fuzz_test.py",
    "integration/tinybert_test.py",
    "finetune/represent_test.py",
    "integration/xlnet_pretrain_test.py",
    "integration/gpt_pretrain_test.py",
    "models/t5_model_test.py",
    "finetune/seq2seq_test.py",
    "integration/mass_pretrain_test.py",
    "hf/hf_task_heads_test.py",
    "integration/distilbert_test.py",
    "experiments/masking_schemes_test.py",
    "integration/unilm_pretrain_test.py",
    "finetune/unilm_seq2seq_test.py",
    "objectives/t5_architectures_test.py",
    "benchmarks/benchmark_table_test.py",
    "integration/elmo_pretrain_test.py",
    "experiments/compression_test.py",
    "models/fp8_test.py",
    "integration/static_test.py",
    "models/gpt_test.py",
    "objectives/mlm_family_test.py",
    "experiments/t5_objectives_test.py",
    "train/object_store_test.py",
    "finetune/pretrained_test.py",
    "models/albert_test.py",
    "train/t5_step_test.py",
    "finetune/decoding_test.py",
    "benchmarks/xla_flags_check_test.py",
    "models/encoder_test.py",
    "integration/t5_pretrain_test.py",
    "models/elmo_test.py",
)
_RANK = {"tests/" + name: rank for rank, name in enumerate(SLOWEST)}


def file_rank(nodeid: str) -> int:
  """The place of a test's file in SLOWEST; len(SLOWEST) for a file not in it."""
  return _RANK.get(nodeid.split("::", 1)[0], len(SLOWEST))


def pytest_collection_modifyitems(items) -> None:
  """The listed files first, slowest first; each file's tests stay together and in order (the
  sort is stable)."""
  items.sort(key=lambda item: file_rank(item.nodeid))
