"""On CPU the generation service keeps triton out of its process (77 MB of RSS for nothing)."""

import subprocess
import sys
import textwrap


def _run(device: str) -> str:
    code = textwrap.dedent(f"""
        import sys
        from services.generation.__main__ import _without_triton_on_cpu
        _without_triton_on_cpu({device!r})
        import torch._dynamo  # imports triton whenever it can
        from torch.utils._triton import has_triton_package
        print(sys.modules.get("triton") is not None, has_triton_package())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()[-2] + " " + out.stdout.split()[-1]


def test_cpu_processes_never_load_triton():
    assert _run("cpu") == "False False"


def test_cuda_processes_keep_it():
    assert _run("cuda") == "True True"  # and this is what Dynamo does unasked
