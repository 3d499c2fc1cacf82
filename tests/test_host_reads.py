"""A training step reads no value back to the host except around validation and on the steps the progress bar
refreshes (train.log_every_steps, after a validation: its logged tau_sim): each read makes the host wait for the
device. The training metrics are read without waiting (specdraft.train.device_reads; tests/test_device_reads.py).
Tiny target, CPU."""
import lightning as L

from specdraft.recipes import load_recipe
from specdraft.train.trainer import run_train
from tests.host_reads import HostReads
from tests.test_train_export_eval import make_recipe


class StepMarker(L.Callback):
    def __init__(self, reads: HostReads):
        self.reads = reads

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.reads.step = trainer.global_step + 1  # the optimizer step this batch makes


def test_only_logged_steps_read_values_back(tmp_path, tiny_target_dir, distilled):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=12, val_every_steps=6, log_every_steps=4)
    # AdamW's step counts and the token count taken before the batch's copy live on the CPU with a GPU too
    reads = HostReads(only_from=("lightning/pytorch", "specdraft/"),
                      unless_from=("torch/optim/", ":on_before_batch_transfer"))
    with reads:
        run_train(load_recipe(recipe, []), extra_callbacks=[StepMarker(reads)])
    steps_with_reads = {step for step, count in reads.by_step.items() if count and step > 0}
    assert steps_with_reads <= {4, 6, 8, 12}, reads.by_step  # logged steps, and validation's at 6 and 12
    assert 6 in steps_with_reads  # the validation's reads are counted
