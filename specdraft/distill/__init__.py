"""Data generation for `specdraft distill-data`: read prompt sets (`sources`) and regenerate their answers with
the target (`run`), writing the dataset described in `specdraft.data.format`.

Heavy imports stay inside the submodules, so `import specdraft.distill` is cheap.
"""
