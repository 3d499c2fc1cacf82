"""Generic training: one LightningModule for every method, a data module over the distilled dataset."""
