"""specdraft: train the small models that make speculative decoding fast, and prove that they do."""

__version__ = "0.1.0"
