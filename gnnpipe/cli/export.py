"""``gnnpipe export``: a checkpoint folder → one plain model file (state dict + model config).

The file loads with ``gnnpipe.models.load(path)`` in any process (no process group, no checkpoint
reader) and predicts with ``model.predict(data)``.
"""

from __future__ import annotations

import argparse
import sys

from ..core.run.checkpoint import model_from_checkpoint
from ..models import save
from .main import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser("export", help="write the model of a checkpoint as one plain file (state dict + config)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", help="a --checkpoint-dir folder (its newest checkpoint) or one ckpt-* folder in it")
    p.add_argument("--out", required=True, help="the model file to write (e.g. model.pt)")
    p.add_argument("--keep", choices=["best", "last"], default="best",
                   help="weights of the best-validation epoch (if the run kept them) or of the last epoch")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = model_from_checkpoint(args.checkpoint, args.keep)
    save(model, args.out, meta=model.meta)
    n = sum(p.numel() for p in model.parameters())
    done, steps = model.meta["epochs"], model.meta.get("steps")
    best, best_step = model.meta.get("best_epoch", -1), model.meta.get("best_step")
    if model.meta["weights"] == "best" and best_step is not None:  # chosen at a step evaluation (--eval-every-steps)
        which = f"the best validation weights (step {best_step:,}" + (f" of {steps:,})" if steps else ")")
    elif model.meta["weights"] == "best" and best >= 0:
        which = f"the best validation epoch's weights (epoch {best + 1} of {done})"
    elif steps and _counted_in_steps(model.meta):
        which = f"the weights after {steps:,} step{'s' if steps != 1 else ''}"
    else:
        which = f"the weights after {done} epoch{'s' if done != 1 else ''}"
    print(f"wrote {args.out}: {model.spec['name']} with {n:,} parameters, {which}, from {model.meta['checkpoint']}",
          file=sys.stderr)
    return 0


def _counted_in_steps(meta: dict) -> bool:
    """Whether the run of a model's ``meta`` was counted in optimizer steps (``--max-steps``)."""
    return bool((meta.get("config") or {}).get("max_steps"))
