"""The fast lossless runtime: a compact static-cache target (target.py), the EAGLE-2 tree and chain (tree.py),
the draft-verify cycle with CUDA graphs (engine.py, graphs.py), chain cycles with the confidence exit and
shallow-state reuse (chain.py), the dynamic draft length and exit layer (dynamic_exit.py), lossless sampling
(sampling.py), the method hook it calls (drafter.py), loading an export (load.py), and `specdraft bench`
(bench.py, profile.py)."""
