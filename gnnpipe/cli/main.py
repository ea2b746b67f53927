"""Entry point of the ``gnnpipe`` console script.

Each sub-command lives in its own module ``gnnpipe.cli.<name>`` that defines
``register(subparsers)``: it adds its parser and sets ``func`` (called with the parsed namespace,
returning an exit code). Every ``--help`` states each option's default once (see :class:`HelpFormatter`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
import warnings

from .. import __version__
from ..core.run.launch import record_torchrun_error
from ..core.settings.runfile import expand_config_flag
from ..errors import GnnpipeError

#: sub-command modules, in the order ``gnnpipe --help`` lists them
SUBCOMMANDS = ["train", "plan", "export", "predict", "partition", "schedule", "simulate", "compare", "ablate", "report",
               "models", "atoms", "relax", "evaluate"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps description line breaks and appends ``(default: X)`` to an option's help where that informs.

    One rule for every command: the default is appended unless the help already speaks of its default
    (``… (default: the model's)``), the argument is required, the default is ``None`` or empty (the help
    says what happens without it), or the option is a switch (``store_true``/``store_false``: the help
    says what giving it does). ``--x/--no-x`` pairs (:class:`argparse.BooleanOptionalAction`) name the
    default spelling, e.g. ``(default: --bias)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if isinstance(action, argparse.BooleanOptionalAction):
            text = text.replace(" (default: %(default)s)", "")  # added by Python < 3.12 itself
            if isinstance(action.default, bool) and "default" not in text.lower():
                spelling = action.option_strings[0] if action.default else f"--no-{action.option_strings[0][2:]}"
                text += f" (default: {spelling})"
            return text
        if ("%(default)" in text or re.search(r"\bdefault\b", text, re.IGNORECASE) or action.required
                or action.nargs == 0 or action.default in (None, "", argparse.SUPPRESS)):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnpipe",
        description="Distributed full-graph training of deep GNNs: GNNPipe pipeline parallelism, "
        "graph parallelism and their hybrid.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gnnpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        modname = f"{__package__}.{name.replace('-', '_')}"
        if importlib.util.find_spec(modname) is None:
            continue
        importlib.import_module(modname).register(sub)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings of the command line as one line for the user, not the source line that raised them."""
    return f"gnnpipe: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    warnings.formatwarning = _format_warning
    parser = build_parser()
    given = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(given)
    args.argv = given  # the words given: `gnnpipe train` without a flag that chooses the job trains the demo
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "config", None) and given[:1] == ["train"]:  # a run file: its settings come first
            args = parser.parse_args(expand_config_flag(given, args.flags_parser))
            args.argv = given
        return int(args.func(args) or 0)
    except GnnpipeError as exc:
        print(f"gnnpipe: error: {exc}", file=sys.stderr)
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):  # under torchrun: its failure summary shows this message
            record_torchrun_error(f"gnnpipe: error: {exc}")
        return 2
    except KeyboardInterrupt as exc:
        print(f"gnnpipe: interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as exc:
        if exc.filename is None:  # not about a path the user gave
            raise
        print(f"gnnpipe: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
