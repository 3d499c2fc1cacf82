"""The bottom layer: types and helpers every other part of specdraft shares, importing nothing of it.

`errors` (the one-line user error), `io` (packaged files, atomic writes), `types` (the target's geometry and
features, a training batch, a draft's build context, a loss) and `drafting` (what a runtime drafter declares
and the hooks the runtime's cycle calls: acceptance, tree scoring, extra prompt context).
"""
