"""Data generation for `specdraft distill-data`: read prompt sets (`sources`) and regenerate their answers with
the target (`distill`), writing the dataset described in `specdraft.data.format`.

Heavy imports stay inside the submodules, so `import data_gen` is cheap.
"""
