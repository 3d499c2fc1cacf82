"""Tiny random targets and tokenizers for tests, demos and benchmarks, built in place and never downloaded: a
byte-level tokenizer with a ChatML template and small Llama / Qwen2 targets (tiny.py), a small model of every target
family the verifier runs (families.py), llama.cpp's server on the embedded SmolLM2 (llama_server.py), and one
DeepSpeed rank on the CPU that builds a draft plainly and under ZeRO-3 (zero3.py).

The test suite and the benchmark suites (tools/bench/) import it; nothing else in specdraft does
(tests/test_import_order.py keeps it beside the cli, at the top of the layer order)."""
