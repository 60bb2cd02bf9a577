"""bench/cpu_floor.py's byte count: every served storage once (a tied head and embedding count
once), the one-row tables left out; and the report states the ratio against the goal."""

from __future__ import annotations

import torch

from bench.cpu_floor import render, served_bytes


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("codes", torch.zeros(1000, dtype=torch.uint8))
        self.register_buffer("scale", torch.zeros(10, dtype=torch.float16))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.embed = torch.nn.Module()
        self.embed.register_buffer("table", torch.zeros(500, dtype=torch.uint8))
        self.lm_head = torch.nn.Module()
        self.lm_head.register_buffer("table", self.embed.table)  # tied: the same storage
        self.register_buffer("norm", torch.zeros(4, dtype=torch.float32))
        self.register_buffer("cos_sin", torch.zeros(1000, dtype=torch.float32))  # one row a step


def test_every_storage_counts_once_and_one_row_tables_not_at_all():
    assert served_bytes(Model()) == {"decoder layers": 2 * (1000 + 20), "LM head (tied embedding)": 500, "norms": 16}


def test_the_report_says_met_or_missed():
    r = {"meta": {"date": "d", "commit": "c", "machine": "m", "loadavg": "0"}, "threads": 2, "steps": 96,
         "context": 88, "bytes": {"decoder layers": 66e6, "LM head (tied embedding)": 31.9e6}, "total_bytes": 97.9e6,
         "read_gb_s": 20.0, "floor_ms": 4.9, "step_ms": 9.8, "ratio": 2.0, "numerics": {"weights": "Q4_1", "kv_cache": "bf16"}}
    text = render(r)
    assert "**9.80 ms = 2.00× the floor** (goal ≤ 1.4×: missed)" in text and "| **total** | **97.9** |" in text
    assert "goal ≤ 1.4×: met" in render(r | {"step_ms": 6.0, "ratio": 6.0 / 4.9})
