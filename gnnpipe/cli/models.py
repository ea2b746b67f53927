"""gnnpipe models: the registered models, their own options (``--model-arg NAME=VALUE``) and defaults.

Every model is a linear sequence of layer units (encoder, L GNN layers, head). Its options are the extra
keyword arguments of its constructor (gnnpipe.models.model_options); set them with ``--model-arg`` on
``gnnpipe train`` / ``gnnpipe compare`` (repeatable), ``model_args = {…}`` in a study file, or
``TrainConfig(model_args={…})`` in Python. The training hyper-parameters (lr, dropout, weight decay) that
a run leaves unset take the model's recommended defaults listed here.

examples:
  gnnpipe models
  gnnpipe models gcnii
  gnnpipe train --model gcnii --model-arg alpha=0.1 --model-arg lamda=0.6
"""

from __future__ import annotations

import argparse
import inspect

from .. import models
from ..tasks.s2ef.defaults import MODEL_DEFAULTS
from .main import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser("models", help="list the models, their options (--model-arg) and default hyper-parameters",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("names", nargs="*", metavar="MODEL", help="only these models (default: all)")
    p.set_defaults(func=run)


def describe(name: str) -> str:
    """A few lines about one registered model: summary, options (with defaults and help), default hyper-parameters."""
    cls = models.get(name)

    doc = inspect.getdoc(cls) or cls.__name__
    summary = " ".join(line.strip() for line in doc.split("\n\n")[0].splitlines()).replace("``", "")
    lines = [f"{name}: {summary}"]
    if getattr(cls, "task", ""):
        lines.append(f"  task: {cls.task}")
    opts = models.model_options(name)
    if opts:
        lines.append("  options (--model-arg NAME=VALUE):")
        for o in opts.values():
            lines.append(f"    {o.name}={o.default!r} ({o.type_name})" + (f": {o.help}" if o.help else ""))
    else:
        lines.append("  options: none")
    hp = ", ".join(f"{k}={v!r}" for k, v in cls.default_hparams.items())
    lines.append(f"  default hyper-parameters: {hp}")

    if name in MODEL_DEFAULTS:  # what `gnnpipe train` on structures takes for the flags not given
        rec = ", ".join(f"{k}={v!r}" for k, v in MODEL_DEFAULTS[name].items())
        lines.append(f"  S2EF defaults (gnnpipe train on structures, flags not given; they replace the option "
                     f"defaults above): {rec}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    names = args.names or models.available()
    for n in names:
        models.get(n)  # an unknown name fails before anything is printed (lists the available ones)
    print("\n\n".join(describe(n) for n in names))
    return 0
