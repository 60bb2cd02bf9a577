"""xgrammar, imported without transformers: the one way services/ gets the xgrammar module.

xgrammar imports transformers at module level, only for three names: two tokenizer base classes
(isinstance checks in TokenizerInfo.from_huggingface) and LogitsProcessor (the base of its
HF-generate adapter). mstar uses neither: it builds TokenizerInfo from the GGUF's own vocabulary
(compiler.py). Importing transformers for them cost the generation process 16-21 MB of RSS
(transformers, tokenizers, huggingface_hub, PIL; measured in the running service and after torch),
and services never import transformers themselves (it is the tests' correctness oracle).

So the first import puts a stand-in holding those three names under sys.modules["transformers"]
and removes it once xgrammar is loaded: a later `import transformers` (a test, a benchmark) gets
the real package. If xgrammar ever needs more of transformers at import, the stand-in import
fails, the half-imported xgrammar modules are dropped, and xgrammar is imported the usual way.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import types

log = logging.getLogger(__name__)
_importing = threading.Lock()  # one stand-in import at a time


def xgrammar() -> types.ModuleType:
    """The xgrammar module (imported on first use; the compile thread warms it up at start)."""
    # import_module, not sys.modules.get: it waits for an import still running on another thread.
    if "xgrammar" in sys.modules or "transformers" in sys.modules:  # transformers: already paid for
        return importlib.import_module("xgrammar")
    with _importing:
        if "xgrammar" in sys.modules:
            return importlib.import_module("xgrammar")
        sys.modules["transformers"] = _stand_in()
        try:
            return importlib.import_module("xgrammar")
        except (ImportError, AttributeError) as e:
            for name in [m for m in sys.modules if m == "xgrammar" or m.startswith("xgrammar.")]:
                del sys.modules[name]
            log.warning("xgrammar needs transformers at import; importing both", extra={"error": str(e)})
            sys.modules.pop("transformers", None)
            return importlib.import_module("xgrammar")
        finally:
            if getattr(sys.modules.get("transformers"), "__mstar_stand_in__", False):
                del sys.modules["transformers"]


def _stand_in() -> types.ModuleType:
    module = types.ModuleType("transformers", "mstar's stand-in while xgrammar imports (xgr.py)")
    module.__mstar_stand_in__ = True

    class PreTrainedTokenizerBase:  # never an instance: from_huggingface is not used here
        pass

    class PreTrainedTokenizerFast(PreTrainedTokenizerBase):
        pass

    class LogitsProcessor:
        pass

    module.PreTrainedTokenizerBase = PreTrainedTokenizerBase
    module.PreTrainedTokenizerFast = PreTrainedTokenizerFast
    module.LogitsProcessor = LogitsProcessor
    return module
