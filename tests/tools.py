"""The scripts of tools/ (not a package) as modules, for their tests."""
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _load(key: str, path: Path) -> ModuleType:
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def load_tool(name: str) -> ModuleType:
    """tools/<name>.py, loaded once and registered in sys.modules (dataclasses look their module up there) as
    <name> with "/" as "_": `load_tool("bench/train")` is the training suite, module `bench_train`. A suite's
    shared helper, tools/bench/suite.py, is loaded first as `suite`, the name the suites import it by."""
    if name.startswith("bench/"):
        _load("suite", TOOLS / "bench" / "suite.py")
    return _load(name.replace("/", "_"), TOOLS / f"{name}.py")
