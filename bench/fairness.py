"""Does a long prompt starve a short one? TTFT of a short chat while a ~6.8k-token chat prefills.

    python -m bench.fairness [--policies fcfs,fair] [--tools 128] [--parts stack,engine]

Two scheduler policies, picked by the generation flag: `fcfs` (`--long-prefill-token-threshold 0`,
every prefill takes what is left of the step: the policy before issue 28) and `fair` (the default,
services/generation/scheduler.py). Two prompts:
- long: a chat with `--tools` tool definitions (the default model's template has no tool support,
  so preprocess renders them into the system message: ~6.8k prompt tokens at 128), 1 new token;
- short: "Say hello in French." (a few dozen prompt tokens with the template's system line).
Parts:
- stack: one real stack per policy (`make run`'s defaults: Envoy + preprocess + generation, default
  model), both up, each phase run on each stack in turn so a shared box's load drifts over both
  alike. OpenAI `/v1/chat/completions` streams through Envoy, greedy, a unique first line per
  request (no prefix-cache help). Phases: the short chat alone (3 times, 8 new tokens), the long
  chat alone, then the long chat again with a short chat sent at 25 % and at 50 % of the long
  one's idle TTFT. TTFT: the first chunk carrying the model's output (text, a tool call or the
  finish). Steps and their mean time and tokens: the generation service's /metrics.
- engine: the same two prompts on the engine alone in this process, the short one added after the
  long one's first chunk: each step's tokens and time (the policy's own effect, no transport).
Also measured in this process: what rendering and tokenizing the long chat costs preprocess's event
loop (it runs there, holding other clients back that long).
Writes the `fairness` section of docs/benchmarks.md and bench/out/fairness.json. Not part of
`make bench`: a 6.8k-token prefill takes minutes on a shared 2-core box (a chunk's attention grows
with its depth into the prompt), and the part runs four of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import time
import uuid
from pathlib import Path

import httpx

from bench import doc_sections, procs
from bench.run import _commit, _cpu_name
from bench.targets import OUT, log

DOC = procs.ROOT / "docs" / "benchmarks.md"
POLICIES = {"fcfs": ["--long-prefill-token-threshold", "0"], "fair": []}
# A 512-token chunk deep into a long prompt can take over the watchdog's default 30 s on a loaded
# 2-core box (the attention over the context grows with it): not a stall, so give it room.
GENERATION_ARGS = ["--watchdog-s", "900"]
SHORT_TEXT = "Say hello in French."
SHORT_TOKENS = 8
ARRIVALS = (0.25, 0.5)  # when the short chats arrive, as a share of the long chat's idle TTFT
STEP_METRICS = ("mstar_generation_step_seconds", "mstar_generation_step_batch_tokens")


def tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"lookup_{i}", "description": f"Kind {i}.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}} for i in range(n)]


def long_body(num_tools: int) -> dict:
    return {"model": "default", "stream": True, "temperature": 0.0, "max_tokens": 1, "tools": tools(num_tools),
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": f"Session {uuid.uuid4().hex}."},
                         {"role": "user", "content": "Which tool finds records of kind 7?"}]}


def short_body() -> dict:
    return {"model": "default", "stream": True, "temperature": 0.0, "max_tokens": SHORT_TOKENS,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": f"Session {uuid.uuid4().hex}."},
                         {"role": "user", "content": SHORT_TEXT}]}


async def chat(http: httpx.AsyncClient, body: dict) -> dict:
    """TTFT and end-to-end seconds of one streamed chat, and its prompt tokens."""
    t0 = time.perf_counter()
    ttft, prompt_tokens = None, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]":
                continue
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(f"in-band error: {obj['error']}")
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                if ttft is None and (delta.get("content") or delta.get("tool_calls") or choice.get("finish_reason")):
                    ttft = time.perf_counter() - t0
            if obj.get("usage"):
                prompt_tokens = obj["usage"]["prompt_tokens"]
    if ttft is None:
        raise RuntimeError("the stream ended without output")
    return {"ttft_s": ttft, "e2e_s": time.perf_counter() - t0, "prompt_tokens": prompt_tokens}


async def step_counters(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The _sum and _count of the generation service's step histograms."""
    text = (await http.get(url)).text
    out = {}
    for name in STEP_METRICS:
        for part in ("sum", "count"):
            m = re.search(rf"^{name}_{part}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
            out[f"{name}_{part}"] = float(m.group(1)) if m else 0.0
    return out


def step_stats(before: dict, after: dict) -> dict:
    """Steps, mean tokens per step and mean step time between two scrapes. The step-time histogram
    skips the first step after an idle spell (services/common/metrics.py), so it has its own count."""
    d = {k: after[k] - before[k] for k in after}
    steps = d["mstar_generation_step_batch_tokens_count"]
    timed = d["mstar_generation_step_seconds_count"]
    return {"steps": int(steps), "tokens_per_step": d["mstar_generation_step_batch_tokens_sum"] / steps if steps else 0.0,
            "step_ms": 1000 * d["mstar_generation_step_seconds_sum"] / timed if timed else 0.0}


async def measure(stacks: dict, num_tools: int) -> dict:
    """Every phase on each policy's stack in turn (the order alternates), so the load of a shared
    box drifts over both alike."""
    clients = {name: httpx.AsyncClient(base_url=st.http_url, timeout=httpx.Timeout(900.0)) for name, st in stacks.items()}
    metrics = {name: st.metrics_urls["generation"] for name, st in stacks.items()}
    out: dict = {name: {} for name in stacks}
    order = list(stacks)
    try:
        for http in clients.values():
            for _ in range(2):  # first requests allocate and compile: not measured
                await chat(http, short_body())
            await chat(http, long_body(2))  # the tool path (its grammar compiler) warmed on a small chat
        for name in order:
            out[name]["loadavg_start"] = os.getloadavg()[0]
            out[name]["short_idle"] = [await chat(clients[name], short_body()) for _ in range(3)]
            log(f"  {name} short alone: TTFT {[round(r['ttft_s'] * 1000) for r in out[name]['short_idle']]} ms")
        for name in reversed(order):
            r, http = out[name], clients[name]
            before = await step_counters(http, metrics[name])
            r["long_alone"] = await chat(http, long_body(num_tools))
            r["steps_alone"] = step_stats(before, await step_counters(http, metrics[name]))
            log(f"  {name} long alone: {r['long_alone']['prompt_tokens']} tokens, TTFT "
                f"{r['long_alone']['ttft_s']:.1f} s, {r['steps_alone']}")
        for name in order:
            r, http = out[name], clients[name]
            idle_long = r["long_alone"]["ttft_s"]

            async def short_at(delay: float, http=http) -> dict:
                await asyncio.sleep(delay)
                return {"sent_at_s": delay, **await chat(http, short_body())}

            before = await step_counters(http, metrics[name])
            long_task = asyncio.create_task(chat(http, long_body(num_tools)))
            r["short_during"] = list(await asyncio.gather(*(short_at(share * idle_long) for share in ARRIVALS)))
            r["long_contended"] = await long_task
            r["steps_contended"] = step_stats(before, await step_counters(http, metrics[name]))
            r["loadavg_end"] = os.getloadavg()[0]
            log(f"  {name} long with shorts: TTFT {r['long_contended']['ttft_s']:.1f} s; shorts' TTFT "
                f"{[round(x['ttft_s'], 2) for x in r['short_during']]} s")
    finally:
        for http in clients.values():
            await http.aclose()
    return out


def engine_trace(long_tokens: int, short_tokens: int, names: list[str]) -> dict:
    """The same two requests on the engine alone in this process (the real runner, `make run`'s
    defaults): the long prompt, and the short one added once its first step has run. Per step:
    what each computed and the wall time. No HTTP, no event loop: the policy's own effect."""
    from services.generation.engine import Engine, EngineConfig
    from services.generation.model_runner import ModelRunner, RunnerConfig
    from services.generation.sampling_params import SamplingParams
    from services.generation.weights.locate import load_checkpoint

    runner = ModelRunner(load_checkpoint("default"), RunnerConfig(num_blocks=1024, max_num_seqs=64))
    runner.warm_up()
    out = {}
    for k, name in enumerate(names):
        threshold = int(POLICIES[name][1]) if POLICIES[name] else None
        added: dict[str, float] = {}
        first: dict[str, float] = {}
        engine = Engine(runner, EngineConfig(num_blocks=1024, max_num_seqs=64, long_prefill_token_threshold=threshold),
                        on_step=lambda out: None)  # run_once returns each step's output
        schedule, steps = engine.scheduler.schedule, []

        def recorded(schedule=schedule, steps=steps):
            batch = schedule()
            steps.append({"tokens": {s.key: n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)},
                          "start": time.perf_counter()})
            return batch

        engine.scheduler.schedule = recorded
        offset = 100 + 1000 * k  # token ids of their own: no prefix-cache help
        added["long"] = time.perf_counter()
        engine.add_request("long", [offset + j % 997 for j in range(long_tokens)], SamplingParams(temperature=0.0, max_tokens=1))
        while engine.seqs or not engine._commands.empty():
            for event in engine.run_once().tokens:
                first.setdefault(event.key, time.perf_counter())
            if len(steps) == 1 and "short" not in added:  # the long prompt's first chunk has run
                added["short"] = time.perf_counter()
                engine.add_request("short", [offset + 500 + j for j in range(short_tokens)],
                                   SamplingParams(temperature=0.0, max_tokens=1))
        for now, nxt in zip(steps, [*steps[1:], None], strict=True):  # a step lasts until the next is scheduled
            now["s"] = (nxt["start"] if nxt else max(first.values())) - now.pop("start")
        ttft = {key: first[key] - added[key] for key in added}
        out[name] = {"steps": steps, "long_ttft_s": ttft["long"], "short_ttft_s": ttft["short"]}
        log(f"  engine alone, {name}: long {ttft['long']:.1f} s, short {ttft['short']:.1f} s after it was added; "
            f"steps {[(list(st['tokens'].values()), round(st['s'], 1)) for st in steps]}")
    return out


def preprocess_cost(num_tools: int) -> dict:
    """Milliseconds preprocess's event loop spends rendering and tokenizing the long chat, and the
    two chats' prompt tokens."""
    from services.preprocess.chat_template import ChatMessage
    from services.preprocess.model import load_model
    from services.preprocess.tools import Tool

    model = load_model("default")
    defs = tuple(Tool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
                 for t in tools(num_tools))
    messages = [ChatMessage("system", f"Session {uuid.uuid4().hex}."),
                ChatMessage("user", "Which tool finds records of kind 7?")]
    short = model.tokenizer.encode(model.chat_template.render(
        [ChatMessage("system", f"Session {uuid.uuid4().hex}."), ChatMessage("user", SHORT_TEXT)]))
    render, encode = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        text = model.chat_template.render(messages, tools=defs)
        t1 = time.perf_counter()
        ids = model.tokenizer.encode(text)
        render.append((t1 - t0) * 1000)
        encode.append((time.perf_counter() - t1) * 1000)
    return {"render_ms": statistics.median(render), "tokenize_ms": statistics.median(encode),
            "long_tokens": len(ids), "short_tokens": len(short)}


def run_stacks(names: list[str], num_tools: int) -> dict:
    from services.stack import Stack, StackConfig

    with contextlib.ExitStack() as held:
        stacks = {}
        for name in names:
            config = StackConfig.with_free_ports(log_dir=OUT / "logs" / f"fairness-{name}", ready_timeout_s=600.0,
                                                 generation_args=GENERATION_ARGS + POLICIES[name])
            log(f"policy {name}: starting a stack (generation {' '.join(POLICIES[name]) or 'defaults'})")
            stacks[name] = held.enter_context(Stack(config))
        return asyncio.run(measure(stacks, num_tools))


def _ms(x: float) -> str:
    return f"{x * 1000:,.0f}"


def _steps(s: dict) -> str:
    return f"{s['steps']}, {s['step_ms']:.0f}, {s['tokens_per_step']:.0f}"


def _stack_table(res: dict) -> list[str]:
    meta, pol = res["meta"], res["policies"]
    if not pol:
        return []
    lines = [
        f"**Through the stack.** One real stack per policy, both up, every phase run on each in turn "
        f"(Envoy + preprocess + generation, default model, `make run`'s defaults but for the policy's flag "
        f"and `--watchdog-s 900`), OpenAI chat streams through Envoy, greedy. Long: a chat with "
        f"{meta['tools']} tools, 1 new token. Short: \"{SHORT_TEXT}\", {SHORT_TOKENS} new tokens, sent at "
        f"{' and '.join(f'{int(a * 100)} %' for a in ARRIVALS)} of the long chat's idle TTFT. Times in ms; "
        f"the short chat's idle TTFT is the median of 3. Step columns: engine steps in the phase, their mean "
        f"time (ms) and tokens (generation /metrics).",
        "",
        "| policy | short TTFT idle | short TTFT during the long prefill | long TTFT alone | long TTFT with "
        "the shorts | steps alone: n, ms, tokens | steps with the shorts: n, ms, tokens | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in pol.items():
        idle = statistics.median(x["ttft_s"] for x in r["short_idle"])
        during = ", ".join(_ms(x["ttft_s"]) for x in r["short_during"])
        lines.append(
            f"| {name} | {_ms(idle)} | {during} | {_ms(r['long_alone']['ttft_s'])} | "
            f"{_ms(r['long_contended']['ttft_s'])} | {_steps(r['steps_alone'])} | {_steps(r['steps_contended'])} | "
            f"{r['loadavg_start']:.1f} → {r['loadavg_end']:.1f} |")
    return [*lines, ""]


def _engine_table(res: dict) -> list[str]:
    if not res["engine"]:
        return []
    lines = [
        "**The engine alone** (this process, the real runner, `make run`'s defaults): the same two prompts, "
        "the short one added once the long one's first chunk has run, both 1 new token; each step's tokens "
        "(long + short) and wall time. Times in s.",
        "",
        "| policy | short: first token after it was added | long: first token | steps: tokens (s) |",
        "|---|---:|---:|---|",
    ]
    for name, r in res["engine"].items():
        steps = " · ".join("+".join(str(st["tokens"].get(k, 0)) for k in ("long", "short") if k in st["tokens"])
                           + f" ({st['s']:.1f})" for st in r["steps"])
        lines.append(f"| {name} | {r['short_ttft_s']:.1f} | {r['long_ttft_s']:.1f} | {steps} |")
    return [*lines, ""]


def render(res: dict) -> str:
    meta, pre = res["meta"], res["preprocess"]
    return "\n".join([
        "## Long prompts don't starve others (prefill fairness)",
        "",
        f"Measured by `python -m bench.fairness --tools {meta['tools']}` on {meta['date']}, commit "
        f"`{meta['commit']}`, {meta['cpu']}, {meta['cores']} cores shared with other work (load average "
        f"{meta['loadavg']} at start). Long prompt: a chat with {meta['tools']} tools ({pre['long_tokens']} "
        f"prompt tokens); short: \"{SHORT_TEXT}\" ({pre['short_tokens']} prompt tokens). Step budget "
        f"(`--max-batched-tokens`) 512. Policies: `fcfs` = `--long-prefill-token-threshold 0` (a running "
        f"prefill takes what is left of the step: the behaviour before issue 28); `fair` = the default "
        f"(threshold half the budget, 256: while shorter prompts wait, a long prefill's chunk is capped at "
        f"256 tokens and they get up to the rest of the step; decodes always get their token; docs/design.md "
        f"\"Scheduler\").",
        "",
        *_stack_table(res),
        *_engine_table(res),
        f"Preprocess renders the long chat's template in {pre['render_ms']:.1f} ms and tokenizes it in "
        f"{pre['tokenize_ms']:.1f} ms on its event loop (measured in the benchmark's process): that is all it "
        f"can hold other clients back, and admission (services/preprocess/admission.py) refuses or admits "
        f"at once, it never queues.",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma list of {', '.join(POLICIES)}")
    ap.add_argument("--tools", type=int, default=128, help="tool definitions in the long chat")
    ap.add_argument("--parts", default="stack,engine", help="stack (through Envoy), engine (the engine alone), or both")
    ap.add_argument("--doc", type=Path, default=DOC, help="the doc whose `fairness` section is rewritten")
    ap.add_argument("--json", type=Path, default=OUT / "fairness.json")
    args = ap.parse_args(argv)
    names = args.policies.split(",")
    if unknown := set(names) - set(POLICIES):
        ap.error(f"unknown policies {sorted(unknown)}; known: {list(POLICIES)}")
    res: dict = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": _commit(), "cpu": _cpu_name(),
                          "cores": os.cpu_count(), "tools": args.tools,
                          "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())},
                 "preprocess": preprocess_cost(args.tools), "policies": {}, "engine": {}}
    parts = set(args.parts.split(","))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if "stack" in parts:
        res["policies"] = run_stacks(names, args.tools)
        args.json.write_text(json.dumps(res, indent=1) + "\n")  # kept should a later part fail
    if "engine" in parts:
        res["engine"] = engine_trace(res["preprocess"]["long_tokens"], res["preprocess"]["short_tokens"], names)
    args.json.write_text(json.dumps(res, indent=1) + "\n")
    body = render(res)
    doc_sections.write(args.doc, "fairness", body)
    print(body)
    log(f"wrote the fairness section of {args.doc} and {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
