"""Entry point of the ``gnnpipe`` console script.

Each sub-command lives in its own module ``gnnpipe.cli.<name>`` that defines
``register(subparsers)``: it adds its parser and sets ``func`` (called with the parsed namespace,
returning an exit code). Defaults are shown in every ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from ..errors import GnnpipeError

#: sub-command modules, in the order ``gnnpipe --help`` lists them
SUBCOMMANDS = ["train", "partition", "schedule", "simulate", "compare", "ablate", "report", "models"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every flag's default and keeps description line breaks."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnpipe",
        description="Distributed full-graph training of deep GNNs: GNNPipe pipeline parallelism, "
        "graph parallelism and their hybrid.",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        modname = f"{__package__}.{name.replace('-', '_')}"
        if importlib.util.find_spec(modname) is None:
            continue
        importlib.import_module(modname).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GnnpipeError as exc:
        print(f"gnnpipe: error: {exc}", file=sys.stderr)
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):  # under torchrun: its failure summary shows this message
            from ..core.launch import record_torchrun_error

            record_torchrun_error(f"gnnpipe: error: {exc}")
        return 2
    except KeyboardInterrupt as exc:
        print(f"gnnpipe: interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
