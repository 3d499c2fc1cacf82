"""Unpacked collation: padding to a multiple of data.pad_to_multiple, capped at max_length."""
import numpy as np
import pytest

from specdraft.config import DataConfig
from specdraft.core.errors import SpecdraftError
from specdraft.train.data import collate


def _rows(*lengths):
    return [{"input_ids": np.arange(1, n + 1), "loss_mask": np.ones(n, dtype=np.int64)} for n in lengths]


@pytest.mark.parametrize("multiple, max_length, expected", [(1, 100, 37), (16, 100, 48), (64, 100, 64),
                                                            (64, 40, 40), (37, 100, 37)])
def test_batch_length_is_rounded_up_and_capped(multiple, max_length, expected):
    batch = collate(_rows(37, 5), max_length, multiple)
    assert batch["input_ids"].shape == (2, expected)
    assert batch["attention_mask"].sum(1).tolist() == [min(37, expected), 5]  # padding is masked out
    assert batch["loss_mask"][:, min(37, expected):].sum() == 0


def test_pad_to_multiple_must_be_positive():
    with pytest.raises(SpecdraftError, match="data.pad_to_multiple"):
        DataConfig(pad_to_multiple=0)
