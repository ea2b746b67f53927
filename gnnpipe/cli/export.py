"""``gnnpipe export``: a checkpoint folder → one plain model file (state dict + model config).

The file loads with ``gnnpipe.models.load(path)`` in any process (no process group, no checkpoint
reader) and predicts with ``model.predict(data)``.
"""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    from .main import HelpFormatter

    p = sub.add_parser("export", help="write the model of a checkpoint as one plain file (state dict + config)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", help="a --checkpoint-dir folder (its newest checkpoint) or one ckpt-* folder in it")
    p.add_argument("--out", required=True, help="the model file to write (e.g. model.pt)")
    p.add_argument("--keep", choices=["best", "last"], default="best",
                   help="weights of the best-validation epoch (if the run kept them) or of the last epoch")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..core.run.checkpoint import model_from_checkpoint
    from ..models import save

    model = model_from_checkpoint(args.checkpoint, args.keep)
    save(model, args.out, meta=model.meta)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {model.spec['name']} with {n:,} parameters ({model.meta['weights']} weights after "
          f"{model.meta['epochs']} epochs of {model.meta['checkpoint']})", file=sys.stderr)
    return 0
