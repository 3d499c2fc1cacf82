"""Device values read back without waiting (specdraft.train.device_reads): off CUDA a stash is ready at once; on a
GPU the stash waits for nothing and its values land once the device has passed it."""
import pytest
import torch

from specdraft.train.device_reads import Deferred, elapsed_ms
from tests.host_reads import HostReads


def test_a_cpu_stash_is_ready_at_once_with_its_numbers():
    reads = Deferred()
    reads.stash(5, torch.device("cpu"), {"loss": torch.tensor(2.5), "acc": torch.tensor([0.25])}, {"rate": 7.0})
    reads.stash(10, torch.device("cpu"), {}, {"rate": 8.0})
    landed = reads.ready()
    assert [stash.key for stash in landed] == [5, 10] and not reads.pending
    assert landed[0].values == {"loss": 2.5, "acc": 0.25, "rate": 7.0} and landed[1].values == {"rate": 8.0}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_stash_reads_nothing_until_it_lands():
    reads, device = Deferred(), torch.device("cuda")
    start = Deferred().stash(0, device, {})
    busy = torch.randn(4096, 4096, device=device)
    with HostReads() as host_reads:
        for _ in range(20):
            busy = busy @ busy / 64  # queued work the stash sits behind
        reads.stash(1, device, {"norm": busy.norm()})
    assert host_reads.count == 0
    landed = reads.ready(wait=True)
    assert landed[0].values["norm"] == pytest.approx(busy.norm().item(), rel=1e-5)
    assert elapsed_ms(start, landed[0]) > 0


def test_sigterm_stops_every_rank_one_step_after_rank_0_saw_it(monkeypatch):
    """The SIGTERM flag Lightning broadcasts before each step of a run on several ranks (here one rank, the
    broadcast and barrier stubbed): read a step later, so the step after the signal raises on every rank."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from specdraft.train.device_reads import SigtermFlag

    broadcasts = []
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: broadcasts.append(int(tensor)))
    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    trainer = SimpleNamespace(received_sigterm=False, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    flag = SigtermFlag(trainer)
    flag()
    trainer.received_sigterm = True
    flag()  # the broadcast of this step carries the signal; the one read now did not
    with pytest.raises(SIGTERMException):
        flag()
    assert broadcasts == [0, 1]


def test_the_trainer_runs_the_flag_in_lightnings_place(tmp_path, tiny_target_dir, distilled):
    """Lightning's training epoch loop calls `_broadcast_sigterm_tensor()` before each step on several ranks."""
    import inspect

    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    from specdraft.recipes import load_recipe
    from specdraft.train.device_reads import SigtermFlag
    from specdraft.train.trainer import build_trainer
    from tests.test_train_export_eval import make_recipe

    recipe = load_recipe(make_recipe(tmp_path, tiny_target_dir, distilled))
    trainer = build_trainer(recipe.train, tmp_path / "run", recipe)
    assert isinstance(trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor, SigtermFlag)
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(_TrainingEpochLoop.advance)
