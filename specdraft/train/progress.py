"""What a user sees of a training run: one progress bar over its steps, and on Ctrl-C one line saying what it kept.

Lightning's own bar redraws twice a refresh (the count, then the metrics), opens a bar a validation, and starts
over each epoch; `TrainProgress` draws one bar over train.max_steps: its count at every optimizer step, its
metrics at the logged ones, its elapsed time redrawn on time (a CPU step takes seconds). On Ctrl-C Lightning tears
the run down and exits (status 1) after logging a notice; `run_train` turns that into `Interrupted`, whose message
`interrupted_message` writes from what `CheckpointStep` saw."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from lightning.pytorch.callbacks import Callback
from tqdm.auto import tqdm

from specdraft.config import TrainConfig
from specdraft.core.console import Ticker, route_library_logs


class TrainProgress(Callback):
    """One bar over the run's optimizer steps (a resumed run starts at its step): counted at every step, its
    postfix set at the logged steps from the last written values of `metrics` (the module's training metrics,
    written once read back without waiting, so those of the logged step before; the validation's logged ones),
    redrawn on time between steps (`Ticker`). Reading the metrics only at logged steps keeps the host from waiting
    for the device: Lightning reads a metric logged with prog_bar=True back at the end of every later step."""

    def __init__(self, cfg: TrainConfig, metrics: Sequence[str]):
        self.max_steps, self.every, self.metrics = cfg.max_steps, cfg.log_every_steps, tuple(metrics)
        self.bar: Optional[tqdm] = None
        self.ticker: Optional[Ticker] = None

    def _shown(self, trainer, pl_module) -> dict:
        logged = {**trainer.logged_metrics, **pl_module.train_metrics}
        return {name.split("/")[-1]: f"{float(logged[name]):.4g}" for name in self.metrics if name in logged}

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            route_library_logs()  # Lightning's and DeepSpeed's handlers too write around the bar, not into it
            self.bar = tqdm(total=self.max_steps, initial=trainer.global_step, desc="train", unit="step",
                            dynamic_ncols=True)
            self.ticker = Ticker(self.bar)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.bar is None or step == self.bar.n:  # a micro-batch inside an accumulated step
            return
        if step % self.every == 0 or step >= self.max_steps:
            self.bar.set_postfix(self._shown(trainer, pl_module), refresh=False)
        self.bar.update(step - self.bar.n)

    def on_validation_end(self, trainer, pl_module):
        if self.bar is not None and not trainer.sanity_checking:
            self.bar.set_postfix(self._shown(trainer, pl_module))
            if trainer.global_step >= self.max_steps:  # the last validation: the line ends before Lightning's
                self._close()                           # `max_steps reached` notice

    def _close(self) -> None:
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_train_end(self, trainer, pl_module):
        self._close()

    def on_exception(self, trainer, pl_module, exception):
        self._close()


class CheckpointStep(Callback):
    """The step of the newest full checkpoint: the one the run resumed from, then each one it saves."""

    def __init__(self):
        self.step: Optional[int] = None

    def on_train_start(self, trainer, pl_module):
        if trainer.ckpt_path is not None:
            self.step = trainer.global_step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.step = checkpoint.get("global_step", trainer.global_step)


def interrupted_message(cfg: TrainConfig, run_dir: Path, stopped_at: int, saved: Optional[int]) -> str:
    """The line a Ctrl-C'd run prints: where it stopped, the checkpoint it kept, how to go on from it."""
    again = "run the same command again" if cfg.resume == "auto" else "add train.resume=auto to the same command"
    if saved is None:
        return (f"train stopped at step {stopped_at}, before its first checkpoint (step {cfg.val_every_steps}): "
                f"nothing kept to resume from; run the same command again")
    return (f"train stopped at step {stopped_at}; kept its checkpoint of step {saved} in {run_dir / 'checkpoints'} "
            f"and the draft weights in {run_dir}/best, last; {again} to resume from step {saved}")
