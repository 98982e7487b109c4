r"""The paper recipes compiled for their papers' TPU slices (`python -m tpu.aot`, one process per
row): per-device memory against HBM, FLOPs and HBM bytes per step, the roofline bound, and the
compile time here. Needs the `[tpu-aot]` extra (libtpu); no TPU.

  python benchmarks/aot_table.py --out=/tmp/aot.jsonl            # every row, resumable
  python benchmarks/aot_table.py --rows=bert-large --out=/tmp/aot.jsonl
  python benchmarks/aot_table.py --render=/tmp/aot.jsonl           # the markdown table

A row already in --out is skipped; a row that does not fit is recorded with tpu.aot's one line.
The slices are the papers' where a current libtpu names them, else the nearest (the `slice`
column says which the paper used).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, config, topology, overrides, what the paper trained on)
ROWS = (
    ("bert-base", "configs/bert.py", "v3:4x4", (),
     "BERT-base: 4 Cloud TPUs, 16 chips (Devlin et al. §A.2)"),
    ("bert-large", "configs/bert.py:size=large", "v3:4x8", (),
     "BERT-large: 16 Cloud TPUs, 64 chips (TPU v2 Pod; v3-64 here, 32 chips)"),
    ("roberta-base", "configs/roberta.py", "v4:4x4x4", (),
     "RoBERTa: 1,024 V100s (no TPU slice; 64 v4 chips here)"),
    ("albert-xxlarge", "configs/albert.py:size=xxlarge", "v3:16x16", (),
     "ALBERT: 64-512 TPU v3 (the largest, v3-512, for xxlarge)"),
    ("xlnet-large", "configs/xlnet.py:size=large", "v3:16x32", (),
     "XLNet-large: 512 TPU v3 chips"),
    ("t5-base", "configs/t5.py", "v3:8x8", (),
     "T5: TPU v3 Pod slices (v3-128 here, 64 chips)"),
    ("t5-base-v5e", "configs/t5.py", "v5e:16x16", ("--config.mesh.fsdp=16",
                                                   "--config.mesh.tensor=2"),
     "T5 on a v5e-256 (batch 128 over data 8 × fsdp 16, tensor 2)"),
    ("electra-base", "configs/electra.py:size=base", "v3:4x4", (),
     "ELECTRA-Base: 16 TPU v3 chips"),
    ("t5-sweep-row", "configs/t5.py", "v5e:2x4", (),
     "one row of the T5 objective sweep on a single-host v5litepod-8"),
)


def run_row(name: str, config: str, topology: str, overrides, paper: str) -> dict:
  command = [sys.executable, "-m", "tpu.aot", f"--config={config}", f"--topology={topology}",
             "--json", *overrides]
  start = time.time()
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
  seconds = time.time() - start
  record = dict(name=name, config=config, topology=topology, overrides=list(overrides),
                paper=paper, compile_seconds=round(seconds, 1), rc=done.returncode)
  reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
  if reports:
    record["report"] = reports[-1]
  errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
  if errors:
    record["error"] = errors[-1][len("error: "):]
  if done.returncode not in (0, 2):
    record["error"] = " ".join(done.stderr.split()[-60:])
  return record


def render(records: list[dict]) -> str:
  gib = 2**30
  lines = ["| recipe | slice (paper's) | devices, mesh | batch | memory / device | GFLOP / device "
           "/ step | roofline step | compile here |", "|---|---|---|---|---|---|---|---|"]
  for r in records:
    rep = r.get("report")
    if rep is None:
      lines.append(f"| {r['config']} | {r['topology']} ({r['paper']}) | — | — | "
                   f"{r.get('error', 'failed')} | — | — | {r['compile_seconds']:.0f} s |")
      continue
    fit = "" if rep["fits"] else " **does not fit**"
    lines.append(
        f"| `{r['config']}` {' '.join(r['overrides'])} | {r['topology']} ({r['paper']}) | "
        f"{rep['devices']} {rep['device_kind']}, {rep['mesh']} | {rep['batch_size']} | "
        f"{rep['used_bytes'] / gib:.2f} of {rep['hbm_bytes'] / gib:.0f} GiB{fit} | "
        f"{rep['flops'] / 1e9:,.0f} | {1e3 * rep['step_seconds']:,.0f} ms | "
        f"{r['compile_seconds']:.0f} s |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", default="", help="comma-separated row names (default: all)")
  parser.add_argument("--out", default="", help="JSONL of the rows' records (resumable)")
  parser.add_argument("--render", default="", help="print the table of this JSONL and exit")
  args = parser.parse_args()
  if args.render:
    with open(args.render) as f:
      print(render([json.loads(line) for line in f if line.strip()]))
    return
  wanted = set(filter(None, args.rows.split(",")))
  unknown = wanted - {row[0] for row in ROWS}
  if unknown:
    sys.exit(f"error: unknown rows {sorted(unknown)}; choose from {[row[0] for row in ROWS]}")
  done = set()
  if args.out and os.path.exists(args.out):
    with open(args.out) as f:
      done = {json.loads(line)["name"] for line in f if line.strip()}
  records = []
  for row in ROWS:
    if (wanted and row[0] not in wanted) or row[0] in done:
      continue
    record = run_row(*row)
    records.append(record)
    print(json.dumps(record), flush=True)
    if args.out:
      with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
  print(render(records))


if __name__ == "__main__":
  main()
