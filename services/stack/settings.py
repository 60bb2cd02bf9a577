"""Every MSTAR_* variable `make run` reads, as `make help` and `make settings` list them:

    python -m services.stack.settings          # make run's own flags (fast: no model code imported)
    python -m services.stack.settings --all    # and every flag of both services (imports them)

All of them come from one rule, services/common/env_flags.py: a flag --x-y of `make run` is
MSTAR_X_Y; of the generation service MSTAR_GENERATION_X_Y, of preprocess MSTAR_PREPROCESS_X_Y (the
children inherit `make run`'s environment). MSTAR_API_KEYS is the one variable without a flag
(keys do not belong on a command line, where `ps` shows them).
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from services.common.env_flags import settings

EXTRA = [("MSTAR_API_KEYS", "", "API keys Envoy requires, comma-separated (with --api-keys-file: both); "
          "default: none, open")]


def rows(all_services: bool) -> list[tuple[str, list[tuple[str, str, str]]]]:
    from services.stack import __main__ as stack

    groups = [("make run (python -m services.stack)", settings(stack.build_parser(), stack.ENV_PREFIX) + EXTRA)]
    if all_services:
        from services.generation import __main__ as generation
        from services.preprocess import __main__ as preprocess

        for name, module in (("generation", generation), ("preprocess", preprocess)):
            groups.append((f"the {name} service (python -m services.{name})",
                           settings(module.build_parser(), module.ENV_PREFIX)))
    return groups


def render(groups: list[tuple[str, list[tuple[str, str, str]]]], width: int = 100) -> str:
    out = []
    for title, table in groups:
        out.append(f"Settings of {title}: variable (flag) meaning")
        pad = max(len(var) for var, _, _ in table) + 2
        for var, flag, text in table:
            words = f"({flag}) {text}" if flag else text
            lines = textwrap.wrap(words, width - pad - 2) or [""]
            out.append(f"  {var:<{pad}}{lines[0]}")
            out += [" " * (pad + 2) + line for line in lines[1:]]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.stack.settings", description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also every flag of both services")
    args = ap.parse_args(argv)
    sys.stdout.write(render(rows(args.all)))
    if not args.all:
        print("Each service's own flags: MSTAR_GENERATION_<FLAG> / MSTAR_PREPROCESS_<FLAG>, e.g.\n"
              "MSTAR_GENERATION_MAX_NUM_SEQS=8 (`make settings` lists them all).")
    print("Under make run, a service flag make run sets itself (model, host, ports, dtype, quantization,\n"
          "data dir, ...) follows make run's setting above: the command line wins over the environment.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
