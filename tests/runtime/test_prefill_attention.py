"""The prefill's attention never takes cuDNN's backend, which plans each new prompt length anew (on an H200 a
prompt's first prefill took 130-230 ms with it, 20-40 ms again); the CPU checks the backend flags the prefill runs
under."""
import torch

from specdraft.decoding import prefill as prefill_module
from tools import count_cycle_launches as tool


def test_prefill_runs_without_cudnn_attention(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    engine = tool.build_engine("tiny", tool.parse_shape("3,2,6"), 64, torch.device("cpu"))
    seen = []
    run_layers = engine.target.run_layers

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return run_layers(*args, **kwargs)

    monkeypatch.setattr(engine.target, "run_layers", recording)
    engine.prefill(torch.arange(9), 0.0)
    assert seen == [False]
    assert torch.nn.attention.SDPBackend.CUDNN_ATTENTION not in prefill_module.PREFILL_ATTENTION
