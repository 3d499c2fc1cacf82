"""Developer tools of this repository (not shipped): benchmark suites (bench/), measurements and reports, the
recipe reference's generator. Run from the repository's root as modules, `python -m tools.NAME` and
`python -m tools.bench.SUITE`, so that they import this checkout's specdraft and each other by package name.
"""
