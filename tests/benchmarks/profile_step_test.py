"""benchmarks/profile_step.py: HLO ops are categorised by what they compute, trace events are read
from each backend's layout with nested time counted once, and a CPU profile of a real step adds
up."""

import os
import sys

import jax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import profile_step as ps  # noqa: E402  pylint: disable=wrong-import-position
import table  # noqa: E402  pylint: disable=wrong-import-position

from bertfam_jax.train import sharding  # noqa: E402

# The shapes of a GPU executable's optimised HLO (cuBLAS and cuDNN custom calls, a Triton GEMM
# fusion, async collectives, backend configs with braces), abridged.
GPU_HLO = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(bf16[8,4]{1,0})->bf16[8,4]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(f32[] %x, f32[] %y)
}

%fused_gelu (param_0: bf16[8,4]) -> bf16[8,4] {
  %param_0 = bf16[8,4]{1,0} parameter(0)
  ROOT %tanh.2 = bf16[8,4]{1,0} tanh(bf16[8,4]{1,0} %param_0)
}

%fused_layer_norm (param_0.1: f32[8,4]) -> f32[8] {
  %param_0.1 = f32[8,4]{1,0} parameter(0)
  %constant.3 = f32[] constant(0)
  ROOT %reduce.4 = f32[8]{0} reduce(f32[8,4]{1,0} %param_0.1, f32[] %constant.3), dimensions={1}, to_apply=%add
}

%triton_gemm_computation (p0: bf16[8,4], p1: bf16[4,4]) -> bf16[8,4] {
  %p0 = bf16[8,4]{1,0} parameter(0)
  %p1 = bf16[4,4]{1,0} parameter(1)
  ROOT %dot.5 = bf16[8,4]{1,0} dot(bf16[8,4]{1,0} %p0, bf16[4,4]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%outer_fusion_computation (q0: bf16[8,4], q1: bf16[4,4]) -> bf16[8,4] {
  %q0 = bf16[8,4]{1,0} parameter(0)
  %q1 = bf16[4,4]{1,0} parameter(1)
  ROOT %inner = bf16[8,4]{1,0} fusion(bf16[8,4]{1,0} %q0, bf16[4,4]{1,0} %q1), kind=kCustom, calls=%triton_gemm_computation
}

%body (state: (s32[], bf16[8,4])) -> (s32[], bf16[8,4]) {
  %state = (s32[], bf16[8,4]{1,0}) parameter(0)
  ROOT %t = (s32[], bf16[8,4]{1,0}) tuple(s32[] %i, bf16[8,4]{1,0} %h)
}

%cond (state.1: (s32[], bf16[8,4])) -> pred[] {
  %state.1 = (s32[], bf16[8,4]{1,0}) parameter(0)
  ROOT %lt = pred[] compare(s32[] %i.1, s32[] %n), direction=LT
}

ENTRY %main.9 (Arg_0.1: bf16[8,4]) -> bf16[8,4] {
  %Arg_0.1 = bf16[8,4]{1,0} parameter(0)
  %custom-call.3 = (bf16[8,4]{1,0}, s8[4194304]{0}) custom-call(bf16[8,4]{1,0} %Arg_0.1, bf16[4,4]{1,0} %w), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(MaskedLM)/encoder/layer_0/mlp/intermediate/dot_general" source_file="layers.py"}, backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1}}
  %custom-call.7 = (bf16[8,2,4,2]{3,2,1,0}, u8[0]{0}) custom-call(bf16[8,2,4,2]{3,2,1,0} %q), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(step)/transpose(jvp(MaskedLM))/encoder/layer_3/attention/dot_product_attention"}
  %gemm_fusion.2 = bf16[8,4]{1,0} fusion(bf16[8,4]{1,0} %Arg_0.1, bf16[4,4]{1,0} %w), kind=kCustom, calls=%outer_fusion_computation, metadata={op_name="jit(step)/transpose(jvp(MaskedLM))/encoder/layer_1/mlp/output/dot_general"}
  %loop_fusion.4 = bf16[8,4]{1,0} fusion(bf16[8,4]{1,0} %Arg_0.1), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(step)/jvp(MaskedLM)/encoder/layer_1/mlp/gelu/tanh"}
  %input_reduce_fusion = f32[8]{0} fusion(f32[8,4]{1,0} %x32), kind=kInput, calls=%fused_layer_norm, metadata={op_name="jit(step)/jvp(MaskedLM)/encoder/layer_1/attention_ln/reduce_sum"}
  %rng_fusion.1 = u32[8,4]{1,0} fusion(u32[2]{0} %key), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(step)/jvp(MaskedLM)/encoder/layer_1/Dropout_0/jit(_bernoulli)/jit(_uniform)/threefry2x32"}
  %all-reduce-start = f32[8,4]{1,0} all-reduce-start(f32[8,4]{1,0} %g), replica_groups={{0,1}}, to_apply=%add
  %copy.12 = bf16[4,8]{0,1} copy(bf16[4,8]{1,0} %t)
  %while.2 = (s32[], bf16[8,4]{1,0}) while((s32[], bf16[8,4]{1,0}) %init), condition=%cond, body=%body
  %multiply_fusion = f32[4,4]{1,0} fusion(f32[4,4]{1,0} %mu), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(step)/mul"}
  ROOT %out = bf16[8,4]{1,0} copy(bf16[8,4]{1,0} %loop_fusion.4)
}
"""


@pytest.fixture(scope="module")
def gpu_hlo():
  return ps.parse_hlo(GPU_HLO)


@pytest.mark.parametrize("name, category, phase, part", [
    ("custom-call.3", "matmul", "forward", "encoder/layer_*/mlp"),
    ("custom-call.7", "attention kernel", "backward", "encoder/layer_*/attention"),
    ("gemm_fusion.2", "matmul", "backward", "encoder/layer_*/mlp"),  # a dot two fusions deep
    ("loop_fusion.4", "elementwise fusion", "forward", "encoder/layer_*/mlp"),
    ("input_reduce_fusion", "reduction fusion", "forward", "encoder/layer_*/attention_ln"),
    ("rng_fusion.1", "dropout RNG", "forward", "encoder/layer_*/Dropout_*"),
    ("all-reduce-start", "collective", "update", "(optimizer, norms)"),
    ("copy.12", "data movement", "update", "(optimizer, norms)"),
    ("while.2", "control", "update", "(optimizer, norms)"),
    ("multiply_fusion", "elementwise fusion", "update", "(optimizer, norms)"),
])
def test_gpu_hlo_ops_are_categorised(gpu_hlo, name, category, phase, part):
  ops, computations = gpu_hlo
  op = ops[name]
  assert ps.categorise(op, ops, computations) == category
  assert (ps.phase(op.op_name), ps.part(op.op_name)) == (phase, part)


def test_hlo_parse_reads_calls_and_targets(gpu_hlo):
  ops, computations = gpu_hlo
  assert ops["while.2"].calls == ("cond", "body")
  assert ops["custom-call.3"].custom_call_target == "__cublas$gemm"
  assert ops["all-reduce-start"].opcode == "all-reduce-start"
  assert ops["custom-call.7"].opcode == "custom-call"  # after a tuple shape
  assert computations["fused_layer_norm"] == ["param_0.1", "constant.3", "reduce.4"]
  assert "Arg_0.1" in computations["main.9"]


def _trace(threads, events):
  """A perfetto trace: threads = {(pid, tid): (process name, thread name)}; events = [(pid, tid,
  name, ts, dur, args)]."""
  meta = []
  for (pid, tid), (process, thread) in threads.items():
    meta += [dict(ph="M", pid=pid, name="process_name", args=dict(name=process)),
             dict(ph="M", pid=pid, tid=tid, name="thread_name", args=dict(name=thread))]
  return dict(traceEvents=meta + [dict(ph="X", pid=pid, tid=tid, name=name, ts=ts, dur=dur,
                                       args=args) for pid, tid, name, ts, dur, args in events])


OPS = {"fusion.1", "custom-call.2", "while.3"}


def test_device_trace_uses_the_xla_ops_line_only():
  trace = _trace({(1, 1): ("/device:GPU:0", "XLA Ops"), (1, 2): ("/device:GPU:0", "Stream #7"),
                  (2, 1): ("/host:CPU", "python")},
                 [(1, 1, "fusion.1", 0, 5, {}), (1, 2, "loop_fusion_kernel", 0, 4,
                                                 {"hlo_op": "fusion.1"}),
                  (1, 1, "%custom-call.2", 5, 3, {}), (2, 1, "fusion.1", 0, 100, {})])
  times = ps.self_times(ps.op_events(trace, OPS))
  assert times == {"fusion.1": 5.0, "custom-call.2": 3.0}


def test_device_trace_without_op_line_adds_up_kernels_by_hlo_op():
  trace = _trace({(1, 2): ("/device:GPU:0", "Stream #7"), (2, 1): ("/host:CPU", "python")},
                 [(1, 2, "sm90_xmma_gemm", 0, 4, {"hlo_op": "custom-call.2"}),
                  (1, 2, "splitK_reduce", 4, 1, {"hlo_op": "custom-call.2"}),
                  (1, 2, "Memcpy DtoD", 5, 2, {}), (2, 1, "custom-call.2", 0, 50, {})])
  assert ps.self_times(ps.op_events(trace, OPS)) == {"custom-call.2": 5.0,
                                                     "kernel Memcpy DtoD": 2.0}


# A step's schedule as a GPU runs it in a CUDA graph: two identical fusions compiled once
# (`deduplicated_name`), cuBLAS GEMMs and a cuDNN attention backward between them.
GRAPH_HLO = """\
%fused_a (p: bf16[8,4]) -> bf16[8,4] {
  %p = bf16[8,4]{1,0} parameter(0)
  ROOT %t = bf16[8,4]{1,0} tanh(bf16[8,4]{1,0} %p)
}

ENTRY %main.1 (x: bf16[8,4]) -> bf16[8,4] {
  %x = bf16[8,4]{1,0} parameter(0)
  %loop_fusion.1 = bf16[8,4]{1,0} fusion(%x), kind=kLoop, calls=%fused_a, metadata={op_name="jit(step)/jvp(M)/encoder/layer_0/mlp/gelu"}
  %custom-call.2 = bf16[8,4]{1,0} custom-call(%loop_fusion.1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp(M)/encoder/layer_0/mlp/output/dot_general"}
  %attention.3 = (bf16[8,4]{1,0}) custom-call(%custom-call.2), custom_call_target="__cudnn$fmhaSoftmaxBackward", metadata={op_name="jit(step)/transpose(jvp(M))/encoder/layer_1/attention/dot_product_attention_bwd"}
  %loop_fusion.5 = bf16[8,4]{1,0} fusion(%attention.3), kind=kLoop, calls=%fused_a, metadata={op_name="jit(step)/jvp(M)/encoder/layer_1/mlp/gelu" deduplicated_name="loop_fusion.1"}
  ROOT %custom-call.6 = bf16[8,4]{1,0} custom-call(%loop_fusion.5), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp(M)/encoder/layer_1/mlp/output/dot_general"}
}
"""


def test_cuda_graph_kernels_are_aligned_with_the_schedule():
  ops, computations = ps.parse_hlo(GRAPH_HLO)
  assert ops["loop_fusion.5"].kernel == "loop_fusion.1"
  graph = {"hlo_op": "command_buffer_1"}  # what a kernel inside a CUDA graph reports
  names = ["loop_fusion_1", "Memset 0", "nvjet_sm90_tst_128x128", "cublasLt::splitKreduce_kernel",
           "cudnn::fusion::compute_dot_do_o", "cudnn_sdpa_sm90_flash_bprop",
           "loop_fusion_1", "nvjet_sm90_tst_128x160"]
  kernels = [dict(name=n, args=graph) for n in names] * 2  # two steps
  expected = ["loop_fusion.1", "kernel Memset 0", "custom-call.2", "custom-call.2", "attention.3",
              "attention.3", "loop_fusion.5", "custom-call.6"]
  assert ps.kernel_ops(kernels, ops, computations) == expected * 2
  # Without the schedule, only kernels named after an op are attributed.
  assert ps.kernel_ops(kernels[:3], set(ops))[1:] == ["kernel Memset 0",
                                                      "kernel nvjet_sm90_tst_128x128"]


def test_gpu_breakdown_folds_layers_and_keeps_unattributed_kernels():
  ops, computations = ps.parse_hlo(GRAPH_HLO)
  times = {"loop_fusion.1": 3.0, "loop_fusion.5": 3.0, "custom-call.2": 2.0,
           "kernel nvjet_sm90_unknown": 1.0, "kernel Memset 0": 1.0}
  result = ps.breakdown(times, ops, computations, steps=1, top=10)
  assert result.by_category == pytest.approx({"elementwise fusion": 6e-3, "matmul": 3e-3,
                                              "data movement": 1e-3})
  assert result.by_phase["(unattributed kernels)"] == pytest.approx(2e-3)
  gelu = result.top_ops[0]
  assert (gelu["ops"], gelu["op_name"]) == (2, "jit(step)/jvp(M)/encoder/layer_*/mlp/gelu")


def test_tpu_style_events_name_the_whole_instruction_and_kernels_their_fusion():
  trace = _trace({(1, 1): ("/device:TPU:0", "XLA Ops")},
                 [(1, 1, "%fusion.1 = bf16[8,4]{1,0} fusion(%p), kind=kLoop", 0, 2, {}),
                  (1, 1, "%while.3 = (s32[]) while(%t), body=%b", 2, 1, {})])
  assert ps.self_times(ps.op_events(trace, OPS)) == {"fusion.1": 2.0, "while.3": 1.0}
  kernels = _trace({(1, 2): ("/device:GPU:0", "Stream #7")}, [(1, 2, "fusion_1", 0, 3, {}),
                                                              (1, 2, "custom_call_2", 3, 1, {})])
  assert ps.self_times(ps.op_events(kernels, OPS)) == {"fusion.1": 3.0, "custom-call.2": 1.0}


def test_cpu_trace_counts_nested_ops_once():
  # A while (scanned layers) of 10 µs containing two ops of 3 and 4 µs on one worker thread, and
  # an op on another thread; the python thread's events are not ops.
  trace = _trace({(1, 1): ("/host:CPU", "tf_XLAEigen/1"), (1, 2): ("/host:CPU", "tf_XLAEigen/2"),
                  (1, 3): ("/host:CPU", "python")},
                 [(1, 1, "while.3", 0, 10, {}), (1, 1, "fusion.1", 1, 3, {}),
                  (1, 1, "custom-call.2", 5, 4, {}), (1, 2, "fusion.1", 2, 6, {}),
                  (1, 3, "fusion.1", 0, 99, {}), (1, 1, "ThunkExecutor::Execute", 0, 12, {})])
  assert ps.self_times(ps.op_events(trace, OPS)) == {"while.3": 3.0, "fusion.1": 9.0,
                                                     "custom-call.2": 4.0}


def test_a_trace_without_op_events_says_what_it_has():
  trace = _trace({(1, 1): ("/host:CPU", "python")}, [(1, 1, "fusion.1", 0, 1, {})])
  with pytest.raises(RuntimeError, match="/host:CPU / python"):
    ps.op_events(trace, OPS)


def test_cpu_profile_of_a_real_step(tmp_path):
  config = table.row_config(table.ROWS_BY_NAME["bert-mini-128"], fast_path=False,
                            extra=("train.batch_size=8",))
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  base = ps.record(config, mesh, steps=1, warmup=0, trace_steps=1, trace_dir=str(tmp_path))
  result = ps.attribute(str(tmp_path), trace_steps=1, top=5)
  assert base["tokens_per_s"] > 0 and result.busy_ms > 0
  assert base["init_s"] > 0 and base["compile_s"] > 0
  assert sum(result.by_category.values()) == pytest.approx(result.busy_ms)
  assert set(result.by_phase) == {"forward", "backward", "update"}
  assert result.by_category["matmul"] > 0 and result.by_category["dropout RNG"] > 0
  assert any(p.startswith("encoder/layer_*/mlp") for p in result.by_part)
  text = ps.report("bert-mini-128", base, result, [("model.dropout=0", base)])
  assert "| matmul |" in text and "| model.dropout=0 |" in text and "1.00x" in text
  # Without dropout no op of the executable draws random bits.
  no_dropout = table.row_config(table.ROWS_BY_NAME["bert-mini-128"], fast_path=False,
                                extra=("train.batch_size=8", "model.dropout=0",
                                       "model.attention_dropout=0"))
  ops, computations = ps.parse_hlo(ps.compiled_step(no_dropout, mesh)[3])
  categories = {ps.categorise(op, ops, computations) for op in ops.values()}
  assert "matmul" in categories and "dropout RNG" not in categories
