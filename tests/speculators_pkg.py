"""speculators 0.9.0, the package whose checkpoint format vLLM loads, for the tests that load specdraft's
`speculators` exports with its own model classes. A dev dependency kept apart from the venv's packages: it pins
transformers <= 5.19 and datasets <= 5.1 (the venv has newer ones), so tools/setup.sh installs it with --no-deps into
.venv/speculators under the repository, put on sys.path by `speculators_package` for those tests alone;
SPECDRAFT_SPECULATORS_PATH names another directory (the variable tests/test_dflash_speculators.py reads too). Its training-data modules import the OpenAI client at
import time, which its model classes never call: without the client installed, an empty stand-in module takes its name while the tests run."""
from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

VERSION = "0.9.0"
INSTALL = (f"pip install --no-deps --target .venv/speculators speculators=={VERSION} hs-connectors=={VERSION} "
           f"loguru==0.7.3")


ROOT = Path(__file__).resolve().parents[1]


def package_dir() -> Path:
    return Path(os.environ.get("SPECDRAFT_SPECULATORS_PATH") or ROOT / ".venv" / "speculators")


def _openai_stand_in() -> dict:
    """The `openai` modules speculators imports from, empty: {name: module}; any name read of them is a placeholder
    class (what speculators' client code puts in its annotations and defaults)."""
    names = ("openai", "openai.types", "openai.types.chat", "openai.types.completion")
    modules = {name: types.ModuleType(name) for name in names}
    for module in modules.values():
        module.__path__ = []
        module.__getattr__ = _placeholder
    return modules


def _placeholder(attribute: str):
    if attribute.startswith("__"):  # a module's own attributes (__file__, ...) stay absent, as tools expect
        raise AttributeError(attribute)
    return type(attribute, (), {})


@pytest.fixture(scope="module")
def speculators_package():
    """The speculators package (its version checked), importable for the module's tests; skips, saying how to
    install it, where it is not."""
    directory = package_dir()
    if not (directory / "speculators").is_dir():
        pytest.skip(f"speculators {VERSION} is not installed at {directory} ({INSTALL}, as tools/setup.sh does; "
                    f"or set SPECDRAFT_SPECULATORS_PATH)")
    added = {} if importlib.util.find_spec("openai") else _openai_stand_in()
    sys.modules.update(added)
    sys.path.insert(0, str(directory))
    try:
        try:
            import speculators
            from speculators.models.peagle import PEagleDraftModel  # noqa: F401  (imports every model module)
            from speculators.version import version
        except ImportError as err:
            pytest.skip(f"speculators at {directory} does not import here ({type(err).__name__}: {err})")
        if version != VERSION:
            pytest.skip(f"speculators {version} at {directory}; these tests read {VERSION}")
        yield speculators
    finally:
        sys.path.remove(str(directory))
        for name in [name for name in sys.modules if name.split(".")[0] in ("speculators", "hs_connectors", *added)]:
            del sys.modules[name]
