"""The method registry: one explicit entry per method module, no import-time side effects."""
from specdraft.core.errors import choices_error
from specdraft.methods import c2t, dflash, eagle3, judge, kangaroo, peagle, poss, vispec
from specdraft.methods.base import MethodSpec

METHODS: dict[str, MethodSpec] = {
    spec.name: spec for spec in (eagle3.SPEC, poss.SPEC, kangaroo.SPEC, c2t.SPEC, judge.SPEC, vispec.SPEC,
                                  peagle.SPEC, dflash.SPEC)}


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise choices_error("method", name, sorted(METHODS))
    return METHODS[name]
