"""The kinds of draft-verify cycle the engine runs, one module each: tree.py (the fixed tree, one CUDA graph),
chain.py (chains with exits and shallow reuse), sized_verify.py (a pruned tree verified at the size it keeps),
depth_stop.py (a tree grown until a stop rule stops it), retrieval.py (retrieved tokens, alone or grafted onto the
tree), block.py (a block drafter's proposals, one pass, verified as a chain or a block tree). base.py is the interface a kind implements (`CycleKind`, `CycleRun`); context.py what every kind reads and
writes (`CycleContext`) and the steps they share."""
