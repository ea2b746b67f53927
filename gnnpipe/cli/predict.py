"""``gnnpipe predict``: class scores of every vertex by a trained model, and its accuracy on each mask.

The model comes from a checkpoint folder (``--checkpoint-dir`` of ``gnnpipe train``) or a model file
(``gnnpipe export``). The graph is the model's training dataset unless ``--dataset`` (and ``--root``,
``--split``) name another; it is preprocessed as at training. ``--out`` gets ``{"scores": [N, C] float,
"pred": [N] long}`` in the dataset's own vertex order.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def register(sub) -> None:
    from .main import HelpFormatter

    p = sub.add_parser("predict", help="predict with a trained model (checkpoint folder or model file)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("model", help="a checkpoint folder or a model file written by gnnpipe export")
    p.add_argument("--dataset", default=None, help="dataset name or file (default: the one the model was trained on)")
    p.add_argument("--root", default=None, help="folder holding the dataset (default: the training run's)")
    p.add_argument("--split", type=int, default=None, help="split index (default: the training run's)")
    p.add_argument("--keep", choices=["best", "last"], default="best", help="checkpoint folders: which weights")
    p.add_argument("--out", default=None, help="write {'scores', 'pred'} here with torch.save")
    p.set_defaults(func=run)


def load_model(src: str, keep: str = "best"):
    """A model from a checkpoint folder or a model file (with ``meta["config"]`` when known)."""
    from ..core.checkpoint import model_from_checkpoint
    from ..models import load

    return model_from_checkpoint(src, keep) if Path(src).expanduser().is_dir() else load(src)


def run(args: argparse.Namespace) -> int:
    import attrs
    import torch

    from ..api import load_data
    from ..core.config import TrainConfig

    model = load_model(args.model, args.keep)
    trained = dict(getattr(model, "meta", {}).get("config") or {})
    fields = attrs.fields_dict(TrainConfig)
    cfg = {k: v for k, v in trained.items() if k in fields}
    for k in ("dataset", "root", "split"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if args.dataset is not None and args.dataset != trained.get("dataset") and args.root is None:
        cfg["root"] = None
    data = load_data(TrainConfig(**cfg))
    scores = model.predict(data)
    pred = scores.argmax(-1)
    print(f"{'mask':<6} {'vertices':>9} {'accuracy':>9}")
    for split in ("train", "val", "test"):
        m = getattr(data, f"{split}_mask", None)
        n = int(m.sum()) if m is not None else 0
        acc = float((pred[m] == data.y[m]).double().mean()) if n else math.nan
        print(f"{split:<6} {n:>9,} {'n/a' if math.isnan(acc) else f'{100 * acc:.2f} %':>9}")
    if args.out:
        Path(args.out).expanduser().parent.mkdir(parents=True, exist_ok=True)
        torch.save({"scores": scores.detach().cpu(), "pred": pred.cpu()}, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
