"""The drafting policies, one module each under the name users give `--policy` (runtime.policy): sam.py, svip.py,
ddd.py, adaptive.py ("fixed": none, the engine's own cycle); dynamic_exit.py is `--dynamic-exit` (DEL); base.py
holds the interface (`DraftingPolicy`, `PolicySetup`), stopping.py what svip and ddd share, suffix_automaton.py
sam's automaton."""
