"""Every command-line flag of a program also read from the environment: `--kv-blocks` of
`python -m services.generation` is MSTAR_GENERATION_KV_BLOCKS, `--file-root` of `make run`
(python -m services.stack) is MSTAR_FILE_ROOT. One rule, so a flag never needs its own env code
and a container or `make run` can set any of them:

    args = parse_with_env(parser, "MSTAR_GENERATION_", argv)

A flag given on the command line wins over its variable; a variable wins over the default. A
value is checked as the flag's own value would be (type, choices), and a bad one is an error
naming the variable. Boolean flags take 1/true/yes/on or 0/false/no/off. Flags that take several
values (nargs) or repeat (append) are not read from the environment: a space-joined string has
no one right reading. `settings(parser, prefix)` lists (variable, flag, help) for `make help`.

On Kubernetes, service links inject `<SERVICE>_PORT=tcp://...` into every pod: a Service named
`mstar-generation` would set MSTAR_GENERATION_PORT and fail the generation pod's start with an
error naming the variable. The manifests in deploy/k8s name no Service `mstar-*`, and the pool's
pods set `enableServiceLinks: false`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_name(prefix: str, action: argparse.Action) -> str:
    long = next(s for s in action.option_strings if s.startswith("--"))
    return prefix + long[2:].replace("-", "_").upper()


def _env_actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of its options
        if isinstance(action, argparse._HelpAction) or not any(s.startswith("--") for s in action.option_strings):
            continue
        if isinstance(action, argparse._AppendAction) or action.nargs not in (None, 0, "?"):
            continue
        if action.nargs == 0 and not _is_boolean(action):  # store_const and the like: no value to read
            continue
        yield action


def _is_boolean(action: argparse.Action) -> bool:
    return isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction))


def env_argv(parser: argparse.ArgumentParser, prefix: str, environ: Mapping[str, str]) -> list[str]:
    """The command-line words the environment stands for (checked; parser.error on a bad value)."""
    words: list[str] = []
    for action in _env_actions(parser):
        name = env_name(prefix, action)
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if _is_boolean(action):
            value = raw.strip().lower()
            if value not in TRUE + FALSE:
                parser.error(f"{name}={raw!r}: use one of {'/'.join(TRUE)} or {'/'.join(FALSE)}")
            on = value in TRUE
            if isinstance(action, argparse.BooleanOptionalAction):
                words.append(flag if on else "--no-" + flag[2:])
            elif on == isinstance(action, argparse._StoreTrueAction):
                words.append(flag)
            continue
        try:
            value = action.type(raw) if callable(action.type) else raw
        except (TypeError, ValueError) as exc:
            parser.error(f"{name}={raw!r} is not a valid {flag} value ({exc})")
        if action.choices is not None and value not in action.choices:
            parser.error(f"{name}={raw!r}: {flag} is one of {', '.join(map(str, action.choices))}")
        words.append(f"{flag}={raw}")
    return words


def parse_with_env(parser: argparse.ArgumentParser, prefix: str, argv: list[str] | None = None,
                   environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """parser.parse_args with each flag's variable first: the command line, parsed after, wins."""
    import sys

    given = sys.argv[1:] if argv is None else list(argv)
    return parser.parse_args(env_argv(parser, prefix, environ) + given)


def settings(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, str, str]]:
    """(variable, flag, help) of every flag the environment can set."""
    rows = []
    for action in _env_actions(parser):
        flag = next(s for s in action.option_strings if s.startswith("--"))
        rows.append((env_name(prefix, action), flag, " ".join((action.help or "").split())))
    return rows
