"""The runtime ops and the optimizer step dispatch: Triton where `use_triton` says so (the interpreter here), the
reference when SPECDRAFT_KERNELS=reference or where triton is not installed (then the ops import and run without
it)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdraft.kernels.adamw8bit import StepScalars, adamw8bit_step, moments_of, new_state
from specdraft.kernels.draft_topk import draft_topk
from specdraft.kernels.grouped_experts import grouped_experts
from specdraft.kernels.kv_compact import compact_kv
from specdraft.kernels.quant_linear import quant_linear, quantize
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.sampled_topk import sampled_topk
from specdraft.kernels.silu_mul import silu_mul
from specdraft.kernels.tree_attention import tree_attention
from specdraft.kernels.tree_frontier import advance_frontier
from specdraft.kernels.tree_sample import verify_sampled
from specdraft.kernels.tree_verify import verify_greedy

ROOT = Path(__file__).resolve().parents[2]
CALLS = {  # module: (its dispatching function, the Triton launcher's name, a call on tiny CPU tensors)
    "adamw8bit": (adamw8bit_step, "adamw8bit_step_triton",
                  lambda op: op(torch.randn(300), torch.randn(300), moments_of(new_state(torch.zeros(300), True)),
                                StepScalars(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, step=1))),
    "draft_topk": (draft_topk, "draft_topk_triton",
                   lambda op: op(torch.randn(2, 30), torch.zeros(30, dtype=torch.int64), 3)),
    "tree_verify": (verify_greedy, "verify_greedy_triton",
                    lambda op: op(torch.randn(3, 20), torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 1]), 2)),
    "kv_compact": (compact_kv, "compact_kv_triton",
                   lambda op: op(torch.randn(1, 1, 8, 4), torch.randn(1, 1, 8, 4), torch.tensor([3, 5]),
                                 torch.tensor([3]), torch.tensor([2]))),
    "tree_attention": (tree_attention, "tree_attention_triton",
                       lambda op: op(torch.randn(2, 2, 16), torch.randn(1, 8, 16), torch.randn(1, 8, 16),
                                     torch.tensor([4]), torch.tril(torch.ones(2, 2, dtype=torch.bool)), 0.25)),
    "rms_norm": (rms_norm, "rms_norm_triton",
                 lambda op: op(torch.randn(2, 24), torch.ones(24), 1e-5, torch.randn(2, 24))),
    "rope_cache": (rope_cache, "rope_cache_triton",
                   lambda op: op(torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8), torch.randn(6, 8),
                                 torch.randn(6, 8), torch.tensor([1, 4]), torch.zeros(2, 6, 8), torch.zeros(2, 6, 8),
                                 torch.tensor([2, 3]))),
    "silu_mul": (silu_mul, "silu_mul_triton", lambda op: op(torch.randn(2, 12), torch.randn(2, 12))),
    "quant_linear": (quant_linear, "quant_linear_triton",
                     lambda op: op(torch.randn(2, 40), quantize(torch.randn(8, 40), 4, group_size=32))),
    "sampled_topk": (sampled_topk, "sampled_topk_triton",
                     lambda op: op(torch.randn(2, 30), torch.zeros(30, dtype=torch.int64), 3, torch.rand(2, 30) + 0.1,
                                   1.0)),
    "tree_sample": (verify_sampled, "verify_sampled_triton",
                    lambda op: op(torch.randn(3, 20), torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 1]),
                                  torch.tensor([0, 1, 2]), torch.rand(4), 2, 1.0)),
    "grouped_experts": (grouped_experts, "grouped_experts_triton",
                        lambda op: op(torch.randn(2, 16), torch.randn(4, 16, 16), torch.randn(4, 16, 8),
                                      torch.tensor([[0, 1], [1, 3]]), torch.rand(2, 2))),
    "tree_frontier": (advance_frontier, "advance_frontier_triton",
                      lambda op: op(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2),
                                    torch.tensor([1, 2]), 3, torch.randn(2, 8), torch.ones(2, 5, dtype=torch.bool))),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_dispatch_follows_use_triton(name, monkeypatch):
    dispatch, launcher_name, call = CALLS[name]
    module = pytest.importorskip(f"specdraft.kernels.{name}.triton_kernel")
    calls = []
    real_launcher = getattr(module, launcher_name)
    monkeypatch.setattr(module, launcher_name,
                        lambda *args, **kwargs: calls.append(1) or real_launcher(*args, **kwargs))
    call(dispatch)
    assert calls == [1]  # TRITON_INTERPRET=1 on this CPU: the kernel ran
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    call(dispatch)
    assert calls == [1]
    monkeypatch.setenv("SPECDRAFT_KERNELS", f"reference:soft_ce,{name}")  # this op's reference alone
    call(dispatch)
    assert calls == [1]
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference:soft_ce")  # another op's
    call(dispatch)
    assert calls == [1, 1]


NO_TRITON = """
import sys
sys.modules["triton"] = None  # `import triton` now fails, as where it is not installed
import torch
from tests.kernels.test_dispatch import CALLS
for name, (dispatch, _, call) in CALLS.items():
    call(dispatch)
    assert f"specdraft.kernels.{name}.triton_kernel" not in sys.modules, name
print("ok")
"""


def test_ops_import_and_run_without_triton():
    env = {"PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", NO_TRITON], cwd=ROOT, capture_output=True, text=True, env=env,
                            check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
