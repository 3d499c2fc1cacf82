"""The benchmark suites behind docs/benchmarks.md, one module a suite, run from the repository's root as
`python -m tools.bench.SUITE ...`; suite.py holds what they share (tables, JSON reports, the child processes'
environment).
"""
