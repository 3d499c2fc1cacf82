"""distill.engine=server: answers from an OpenAI-compatible server that already runs the target (vLLM, SGLang,
llama.cpp's llama-server, llama-cpp-python, ...), asked at `distill.server.url`; this process loads the target's
tokenizer alone (specdraft.targets.load.load_chat_tokenizer).

specdraft applies the chat template itself, so the prompt is exactly the one training sees, and posts it to
/v1/completions: as token ids where the server takes them, else as text (`ServerApi`, chosen by distill.server.api).
The answer's token ids come back where the server offers them, else its text is tokenized again. Sampling is the
recipe's: greedy at distill.temperature=0, else its temperature and top_p, the server's own defaults (top_k, min_p,
repetition penalties) neutralized where the api names them, with a seed drawn from distill.seed and the prompt (a
resumed run asks the same).

`distill.server.concurrency` requests are in flight (worker threads, one keep-alive connection each): the current
shard's first, then the next shard's first-turn prompts, so the server stays busy while a shard is written. An
answer 4xx (but 408 and 429) is that prompt's error, carrying the server's status and message; a 5xx, 408 or 429,
a timeout or a refused connection is retried with exponential backoff. When the retries run out and the server no
longer answers /v1/models, or FAILURES_IN_A_ROW prompts in a row ran out of them, `ServerUnavailable` stops the run
with the shards written so far kept; otherwise that prompt alone is an error. Tokenizer and progress bar are used
from the calling thread only (a fast tokenizer is not safe to share between threads).
"""
from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import queue
import socket
import statistics
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from specdraft.config import SERVER_APIS, DistillConfig, ServerConfig
from specdraft.core.errors import SpecdraftError
from specdraft.targets.generate import cut_at_eos

log = logging.getLogger(__name__)

RETRIED_STATUSES = (408, 429)
"""Client errors that say "later", retried like a 5xx."""
MAX_BACKOFF = 60.0
FAILURES_IN_A_ROW = 3
"""Prompts in a row that ran out of retries, with no answer between them, after which the run stops."""
HEALTH_TIMEOUT = 10.0
"""Seconds the /v1/models check after a prompt's last retry waits."""
MESSAGE_CHARS = 300


@dataclass(frozen=True)
class ServerApi:
    """What a server understands beyond OpenAI's completions (distill.server.api)."""
    name: str
    ids_in: bool
    """The prompt goes as token ids (else as text)."""
    ids_out: Optional[str]
    """Where the answer's token ids come back: token_ids (the choice's field), logprobs (llama.cpp's n_probs
    entries) or None (the text is tokenized again)."""
    extras: Dict[str, object] = field(default_factory=dict)
    """Request fields beyond OpenAI's: the answer's ids asked for, the server's own sampling defaults neutralized."""
    stop_ids: bool = False
    """The target's EOS ids go as stop_token_ids."""


_VLLM_LIKE = {"return_token_ids": True, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
APIS = {
    "vllm": ServerApi("vllm", ids_in=True, ids_out="token_ids", extras=_VLLM_LIKE, stop_ids=True),
    "sglang": ServerApi("sglang", ids_in=True, ids_out="token_ids", extras=_VLLM_LIKE, stop_ids=True),
    "llamacpp": ServerApi("llamacpp", ids_in=True, ids_out="logprobs",
                          extras={"n_probs": 1, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}),
    "llama-cpp-python": ServerApi("llama-cpp-python", ids_in=False, ids_out=None,
                                  extras={"top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}),
    "openai": ServerApi("openai", ids_in=False, ids_out=None),
}
assert set(APIS) == set(SERVER_APIS) - {"auto"}
OWNED_BY = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "me": "llama-cpp-python"}
"""/v1/models' `owned_by` as each server writes it about itself -> its api (distill.server.api=auto)."""


class ServerUnavailable(SpecdraftError):
    """The server stopped answering: the run stops, keeping every shard it wrote."""


class _Refused(Exception):
    """The server answered with a status that retrying would not change (a 4xx other than 408 and 429)."""


class _Exhausted(Exception):
    """A request failed every attempt; `last` says how the last one did, `answered` whether the server replied."""

    def __init__(self, last: str, attempts: int, answered: bool):
        super().__init__(last)
        self.last, self.attempts, self.answered = last, attempts, answered


class _Stopped(Exception):
    """The engine is closing: a queued or retrying request gives up."""


@dataclass
class Reply:
    status: int
    payload: object
    """The JSON body (None when it is not JSON)."""
    text: str
    retry_after: Optional[float] = None

    def message(self) -> str:
        """The server's error message on one line: OpenAI's error.message, FastAPI's detail, or the raw body."""
        body = self.payload
        found = body.get("error", body) if isinstance(body, dict) else None
        found = found.get("message", found.get("detail")) if isinstance(found, dict) else found
        text = found if isinstance(found, str) and found else self.text
        return " ".join(str(text).split())[:MESSAGE_CHARS] or "(no message)"


class Endpoint:
    """HTTP to the server's base URL: one keep-alive connection per thread, the API key (if any) in a header."""

    def __init__(self, url: str, api_key: Optional[str], timeout: float):
        parts = urlsplit(url.rstrip("/"))
        self.secure, self.host, self.port = parts.scheme == "https", parts.hostname or "", parts.port
        self.prefix = parts.path[:-3] if parts.path.endswith("/v1") else parts.path
        self.shown = f"{parts.scheme}://{self.host}{f':{self.port}' if self.port else ''}{parts.path}"
        """The URL as logs and errors show it (without any user:password part)."""
        self.api_key, self.timeout = api_key, timeout
        self.local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        connection = getattr(self.local, "connection", None)
        if connection is not None and connection.timeout != timeout:
            self.drop()
            connection = None
        if connection is None:
            kind = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
            connection = self.local.connection = kind(self.host, self.port, timeout=timeout)
        return connection

    def drop(self) -> None:
        connection, self.local.connection = getattr(self.local, "connection", None), None
        if connection is not None:
            connection.close()

    def call(self, method: str, path: str, body: Optional[dict] = None, timeout: Optional[float] = None) -> Reply:
        """One HTTP exchange -> Reply; OSError (refused, reset, timed out) and http.client errors propagate."""
        headers = {"Accept": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        connection = self._connection(timeout or self.timeout)
        try:
            connection.request(method, self.prefix + path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except BaseException:
            self.drop()  # a half-used connection cannot carry the next request
            raise
        text = raw.decode("utf-8", errors="replace")
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = None
        retry_after = response.getheader("Retry-After")
        return Reply(response.status, payload, text,
                     float(retry_after) if retry_after and retry_after.strip().isdigit() else None)


def transport_problem(err: BaseException, timeout: float) -> str:
    """How a request that got no reply failed, on one line."""
    if isinstance(err, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout:g} s"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:MESSAGE_CHARS]


def api_key(cfg: ServerConfig) -> Optional[str]:
    """The key from the environment variable the recipe names; a named variable that is unset is an error."""
    if not cfg.api_key_env:
        return None
    key = os.environ.get(cfg.api_key_env, "")
    if not key:
        raise SpecdraftError(f"distill.server.api_key_env names ${cfg.api_key_env}, which is not set in this "
                             f"environment; export it (the key is never written to disk) or unset the key")
    return key


def request_seed(seed: int, prompt: List[int]) -> int:
    """A request's sampling seed: distill.seed and the prompt's ids, so a resumed run asks what the first did."""
    digest = hashlib.sha256(f"{seed}:{','.join(map(str, prompt))}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def percentile(values: List[float], fraction: float) -> Optional[float]:
    """The `fraction` quantile of `values` (linear between order statistics), None for none."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]


@dataclass
class ServerAnswer:
    """One prompt's outcome: its text, or the reason it is an error; `cut` when the server stopped at a length
    limit (finish_reason length)."""
    text: str = ""
    ids: List[int] = field(default_factory=list)
    failure: Optional[str] = None
    cut: Optional[str] = None


@dataclass
class _Raw:
    """What a worker brings back: the server's choice (text, ids where given, finish_reason) or a failure."""
    text: str = ""
    ids: Optional[List[int]] = None
    finish: Optional[str] = None
    failure: Optional[str] = None


@dataclass(order=True)
class _Job:
    priority: int
    sequence: int
    body: dict = field(compare=False)
    future: Future = field(compare=False)


class ServerAnswers:
    """The engine: `connect()` checks the server, `start_shard` orders the requests, `answers` asks for a turn's
    prompts (all of them in flight, `concurrency` at a time), `close()` stops the workers and -> the stats."""

    def __init__(self, distill: DistillConfig, tokenizer, eos_ids: List[int]):
        self.cfg, self.server = distill, distill.server
        self.tokenizer, self.eos_ids = tokenizer, list(eos_ids)
        self.endpoint = Endpoint(self.server.url, api_key(self.server), self.server.timeout)
        self.api: ServerApi = APIS["openai"]
        self.model: Optional[str] = None
        self.progress = None
        """A tqdm bar whose postfix shows answer tokens/s (set by the caller; updated from its thread)."""
        self.jobs: "queue.PriorityQueue[_Job]" = queue.PriorityQueue()
        self.waiting: Dict[Tuple[int, ...], Future] = {}
        """Prompts asked ahead (the next shard's first turns), by their ids, until `answers` takes them."""
        self.order, self.sequence = 0, 0
        self.upcoming: List[List[int]] = []
        self.stopping = threading.Event()
        self.fatal: Optional[ServerUnavailable] = None
        """What stopped the run (the first worker's ServerUnavailable), raised to the caller."""
        self.lock = threading.Lock()
        self.workers: List[threading.Thread] = []
        self.latencies: List[float] = []
        self.retries = self.refused = self.failed = self.failures_in_a_row = 0
        self.answer_tokens, self.first_sent, self.last_done = 0, None, None
        self.leading_bos = self._server_adds_bos()

    # --- the server ---------------------------------------------------------------------------------------------

    def connect(self, probe: List[int]) -> "ServerAnswers":
        """Check the server before anything is written: it answers /v1/models (waiting out a server that is still
        starting, as retries allow), the model and api are resolved, and a one-token completion of `probe` (a
        templated prompt) is accepted. Then start the workers."""
        models = self._models()
        self.model = self._pick_model(models)
        owned = next((m.get("owned_by") for m in models if m.get("id") == self.model), None)
        name = self.server.api if self.server.api != "auto" else OWNED_BY.get(str(owned), "openai")
        self.api = APIS[name]
        log.info("distill.engine=server: %s (api %s%s), model %s, %d requests in flight", self.endpoint.shown,
                 name, ", from owned_by" if self.server.api == "auto" else "", self.model, self.server.concurrency)
        try:
            self._ask(self._body(probe, max_tokens=1))
        except _Refused as err:
            raise SpecdraftError(f"the server at {self.endpoint.shown} refused a one-token completion ({err}); "
                                 f"check distill.server.api={name} (valid: {', '.join(SERVER_APIS)}) and "
                                 f"distill.server.model") from None
        except _Exhausted as err:
            raise ServerUnavailable(f"the server at {self.endpoint.shown} did not complete a one-token prompt: "
                                    f"{err.last} after {err.attempts} attempts") from None
        self.latencies.clear()  # the probe's is no answer's
        for index in range(self.server.concurrency):
            worker = threading.Thread(target=self._work, name=f"distill-server-{index}", daemon=True)
            worker.start()
            self.workers.append(worker)
        return self

    def _models(self) -> List[dict]:
        """/v1/models' entries ([] where the server has no such route)."""
        try:
            reply = self._attempts("GET", "/v1/models", None)
        except _Exhausted as err:
            raise ServerUnavailable(f"no server answers at {self.endpoint.shown} ({err.last} after {err.attempts} "
                                    f"attempts); start it first (docs/usage.md) or fix distill.server.url") from None
        if reply.status in (401, 403):
            key = f"the API key in ${self.server.api_key_env}" if self.server.api_key_env else "a request without key"
            raise SpecdraftError(f"the server at {self.endpoint.shown} refused {key} ({reply.status}: "
                                 f"{self._scrub(reply.message())}); set distill.server.api_key_env to the variable "
                                 f"that holds its key")
        if reply.status == 404:
            return []
        data = reply.payload.get("data") if isinstance(reply.payload, dict) else None
        if reply.status != 200 or not isinstance(data, list):
            raise SpecdraftError(f"the server at {self.endpoint.shown} answered /v1/models with {reply.status}: "
                                 f"{self._scrub(reply.message())}; is it an OpenAI-compatible server?")
        return [entry for entry in data if isinstance(entry, dict)]

    def _pick_model(self, models: List[dict]) -> str:
        served = [str(entry.get("id")) for entry in models]
        if self.server.model is not None:
            if served and self.server.model not in served:
                raise SpecdraftError(f"distill.server.model={self.server.model!r} is not served at "
                                     f"{self.endpoint.shown}; it serves: {', '.join(served)}")
            return self.server.model
        if len(served) != 1:
            listed = f"it serves {', '.join(served)}" if served else "it lists no models"
            raise SpecdraftError(f"set distill.server.model: the server at {self.endpoint.shown} does not say which "
                                 f"model to ask ({listed})")
        return served[0]

    def _healthy(self) -> bool:
        try:
            return self.endpoint.call("GET", "/v1/models", timeout=min(HEALTH_TIMEOUT, self.server.timeout)).status \
                < 500
        except (OSError, http.client.HTTPException):
            return False

    def _scrub(self, text: str) -> str:
        """`text` with the API key (should a server echo it) blanked out."""
        key = self.endpoint.api_key
        return text.replace(key, "***") if key else text

    # --- one request ----------------------------------------------------------------------------------------------

    def _server_adds_bos(self) -> bool:
        """Whether the target's tokenizer puts BOS before plain text, as a server then does to a text prompt: the
        templated prompt's own leading BOS is left out of the text sent."""
        bos = self.tokenizer.bos_token_id
        return bos is not None and self.tokenizer("x").input_ids[:1] == [bos]

    def _prompt(self, ids: List[int]):
        if self.api.ids_in:
            return list(ids)
        if self.leading_bos and ids[:1] == [self.tokenizer.bos_token_id]:
            ids = ids[1:]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _body(self, ids: List[int], max_tokens: Optional[int] = None) -> dict:
        sampled = self.cfg.temperature > 0
        body = {"model": self.model, "prompt": self._prompt(ids), "max_tokens": max_tokens or self.cfg.max_new_tokens,
                "temperature": self.cfg.temperature, "top_p": self.cfg.top_p if sampled else 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, **self.api.extras}
        if sampled:
            body["seed"] = request_seed(self.cfg.seed, ids)
        if self.api.stop_ids and self.eos_ids:
            body["stop_token_ids"] = self.eos_ids
        return body

    def _attempts(self, method: str, path: str, body: Optional[dict]) -> Reply:
        """The exchange, retried (backoff doubling, Retry-After honoured) while the server answers a 5xx, 408 or
        429 or does not answer -> the first other reply; _Exhausted when no attempt got one."""
        attempts = self.server.retries + 1
        for attempt in range(attempts):
            if self.stopping.is_set():
                raise _Stopped()
            started = time.perf_counter()
            try:
                reply = self.endpoint.call(method, path, body)
            except (OSError, http.client.HTTPException) as err:
                last, answered, retry_after = transport_problem(err, self.server.timeout), False, None
            else:
                if not (reply.status >= 500 or reply.status in RETRIED_STATUSES):
                    if reply.status == 200 and body is not None:
                        with self.lock:
                            self.latencies.append(time.perf_counter() - started)
                    return reply
                last = f"{reply.status}: {self._scrub(reply.message())}"
                answered, retry_after = True, reply.retry_after
            if attempt + 1 < attempts:
                with self.lock:
                    self.retries += 1
                delay = min(self.server.backoff * 2 ** attempt, MAX_BACKOFF)
                self.stopping.wait(min(max(delay, retry_after or 0.0), MAX_BACKOFF))
        raise _Exhausted(last, attempts, answered)

    def _ask(self, body: dict) -> dict:
        """POST /v1/completions -> the choice; _Refused for a final 4xx, _Exhausted when every attempt failed."""
        reply = self._attempts("POST", "/v1/completions", body)
        if reply.status != 200:
            raise _Refused(f"server answered {reply.status}: {self._scrub(reply.message())}")
        choices = reply.payload.get("choices") if isinstance(reply.payload, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise _Refused(f"server answered 200 without a choice: {self._scrub(reply.message())}")
        return choices[0]

    def _answer(self, body: dict) -> _Raw:
        """One prompt in a worker thread -> its _Raw; ServerUnavailable when the server is gone."""
        try:
            choice = self._ask(body)
        except _Refused as err:
            with self.lock:
                self.refused += 1
            return _Raw(failure=str(err))
        except _Exhausted as err:
            return self._after_retries(err)
        with self.lock:
            self.failures_in_a_row, self.last_done = 0, time.perf_counter()
        return _Raw(text=str(choice.get("text") or ""), ids=self._answer_ids(choice),
                    finish=choice.get("finish_reason"))

    def _after_retries(self, err: _Exhausted) -> _Raw:
        """A prompt that ran out of retries is its own error while the server still answers; else (or after
        FAILURES_IN_A_ROW such prompts) the run stops."""
        with self.lock:
            self.failures_in_a_row += 1
            in_a_row = self.failures_in_a_row
        gone = in_a_row >= FAILURES_IN_A_ROW or not self._healthy()
        if gone:
            why = f"{in_a_row} prompts in a row failed" if in_a_row >= FAILURES_IN_A_ROW else "it stopped answering"
            raise ServerUnavailable(f"the server at {self.endpoint.shown} failed: {why} ({err.last} after "
                                    f"{err.attempts} attempts)")
        with self.lock:
            self.failed += 1
        return _Raw(failure=f"server failed {err.attempts} attempts: {err.last}")

    def _answer_ids(self, choice: dict) -> Optional[List[int]]:
        """The answer's token ids where the api says the server gives them (None: it gave none)."""
        if self.api.ids_out == "token_ids":
            found = choice.get("token_ids")
        elif self.api.ids_out == "logprobs":
            logprobs = choice.get("logprobs")
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            found = [entry.get("id") if isinstance(entry, dict) else None for entry in content] \
                if isinstance(content, list) else None
        else:
            return None
        return [int(i) for i in found] if isinstance(found, list) and all(isinstance(i, int) for i in found) \
            else None

    # --- the workers ------------------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job.future is None:  # the sentinel close() puts
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                job.future.set_result(self._answer(job.body))
            except BaseException as err:  # noqa: BLE001 (handed to the waiting thread, which raises it)
                if isinstance(err, ServerUnavailable):
                    with self.lock:
                        self.fatal = self.fatal or err
                    self.stopping.set()
                job.future.set_exception(err)

    def _submit(self, ids: List[int], priority: int) -> Future:
        future: Future = Future()
        self.sequence += 1
        self.jobs.put(_Job(priority, self.sequence, self._body(ids), future))
        if self.first_sent is None:
            self.first_sent = time.perf_counter()
        return future

    def start_shard(self, order: int, upcoming: List[List[int]]) -> None:
        """Requests from here on belong to the `order`-th shard of this run; `upcoming` (the next shard's first-turn
        prompts) are asked behind its first ones (queued after them, and behind all of its own later ones)."""
        self.order, self.upcoming = order, list(upcoming)

    def answers(self, prompts: List[List[int]]) -> List[ServerAnswer]:
        """Every prompt's answer (in order), all of them in flight at once, `concurrency` at a time."""
        futures = {}
        for ids in prompts:
            key = tuple(ids)
            if key not in futures:
                futures[key] = self.waiting.pop(key, None) or self._submit(ids, self.order)
        for ids in self.upcoming:
            if tuple(ids) not in self.waiting:
                self.waiting[tuple(ids)] = self._submit(ids, self.order + 1)
        self.upcoming = []
        pending = set(futures.values())
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    self.stopping.set()
                    raise self.fatal or future.exception()
            self._show_rate()
        converted = {key: self._convert(future.result()) for key, future in futures.items()}
        return [converted[tuple(ids)] for ids in prompts]

    def _convert(self, raw: _Raw) -> ServerAnswer:
        """A worker's _Raw -> ServerAnswer, with the text decoded from the ids (as the built-in engines decode
        theirs) or the ids tokenized from the text, cut before the first EOS; counts its tokens."""
        if raw.failure is not None:
            return ServerAnswer(failure=raw.failure)
        if raw.ids is not None:
            ids = cut_at_eos(raw.ids, self.eos_ids)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        else:
            text, ids = raw.text, self.tokenizer.encode(raw.text, add_special_tokens=False)
        self.answer_tokens += len(ids)
        return ServerAnswer(text=text, ids=ids, cut=self._cut(raw.finish, len(ids)))

    def _cut(self, finish: Optional[str], tokens: int) -> Optional[str]:
        if finish != "length":
            return None
        if tokens >= self.cfg.max_new_tokens:
            return f"cut at distill.max_new_tokens={self.cfg.max_new_tokens}"
        return f"cut by the server's length limit after {tokens} tokens (its context is full)"

    def _show_rate(self) -> None:
        if self.progress is not None and self.first_sent is not None:
            seconds = max(time.perf_counter() - self.first_sent, 1e-9)
            self.progress.set_postfix(tok_s=f"{self.answer_tokens / seconds:.0f}", refresh=True)

    def close(self) -> dict:
        """Stop the workers (requests still queued are dropped) -> this run's stats for throughput.json."""
        self.stopping.set()
        for future in self.waiting.values():
            future.cancel()
        for _ in self.workers:
            self.jobs.put(_Job(-1, -1, {}, None))
        return self.stats()

    def stats(self) -> dict:
        """Requests answered, refused (4xx) and failed (out of retries), the retries, each answered request's latency
        (p50/p90, seconds) and answer tokens/s from the first request to the last answer."""
        seconds = (self.last_done - self.first_sent) if self.last_done and self.first_sent else 0.0
        with self.lock:
            latencies = sorted(self.latencies)
            counted = {"answered": len(latencies), "refused": self.refused, "failed": self.failed,
                       "retries": self.retries}
        p50, p90 = percentile(latencies, 0.5), percentile(latencies, 0.9)
        return {"url": self.endpoint.shown, "api": self.api.name, "model": self.model,
                "concurrency": self.server.concurrency, **counted, "latency_p50_s": p50, "latency_p90_s": p90,
                "answer_tokens": self.answer_tokens, "seconds": seconds,
                "tokens_per_s": self.answer_tokens / seconds if seconds > 0 else 0.0}
