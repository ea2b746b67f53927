"""One training epoch of our ``gat`` (single process, GAT paper shape: 2 layers, 8 heads × 8 hidden, dropout
0.6) vs a plain PyG GATConv stack of the same shape, on Amazon Computers, interleaved in one run.

    python benchmarks/bench_gat_vs_pyg.py [--epochs 10] [--threads 1] [--layers 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
HEADS, HIDDEN, DROPOUT = 8, 8, 0.6


def load():
    from gnnpipe.data import load_dataset, prepare

    return prepare(load_dataset("Computers", SHARED / "amazon"))


class PyGGAT(nn.Module):
    """The PyG example's GAT: (dropout, GATConv, ELU) × (L − 1), dropout, GATConv to the classes (1 head)."""

    def __init__(self, f, c, layers):
        from torch_geometric.nn import GATConv

        super().__init__()
        dims = [f] + [HEADS * HIDDEN] * (layers - 1)
        self.convs = nn.ModuleList(GATConv(d, HIDDEN, heads=HEADS, dropout=DROPOUT) for d in dims[:-1])
        self.out = GATConv(dims[-1], c, heads=1, concat=False, dropout=DROPOUT)

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = F.elu(conv(F.dropout(x, DROPOUT, self.training), edge_index))
        return self.out(F.dropout(x, DROPOUT, self.training), edge_index)


def make_steps(data, layers):
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer

    cfg = TrainConfig(model="gat", layers=layers, hidden=HIDDEN, dropout=DROPOUT, activation="elu", bias=True,
                      lr=0.005, epochs=1)
    ours = SingleProcessTrainer(data, cfg)
    torch.manual_seed(0)
    pyg = PyGGAT(data.x.size(1), int(data.y.max()) + 1, layers)
    opt = torch.optim.Adam(pyg.parameters(), lr=0.005, weight_decay=5e-4)
    mask = data.train_mask

    def pyg_step():
        pyg.train()
        opt.zero_grad()
        F.cross_entropy(pyg(data.x, data.edge_index)[mask], data.y[mask]).backward()
        opt.step()

    def ours_step():
        ours.train_epoch(0)

    pyg_step()
    ours_step()
    return ours_step, pyg_step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10, help="timed epochs of each, interleaved")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ours, pyg = make_steps(load(), a.layers)
    wall = {"gnnpipe": [], "PyG": []}
    cpu = {"gnnpipe": [], "PyG": []}
    for _ in range(a.epochs):
        for name, fn in (("gnnpipe", ours), ("PyG", pyg)):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
    print(f"GAT ({a.layers} layers, {HEADS} heads x {HIDDEN}) on Amazon Computers, {a.threads} thread(s), "
          f"{a.epochs} interleaved epochs (median)")
    for name in wall:
        print(f"  {name:8s} wall {statistics.median(wall[name]) * 1000:8.1f} ms/epoch   "
              f"thread CPU {statistics.median(cpu[name]) * 1000:8.1f} ms/epoch")
    print(f"  ratio gnnpipe / PyG: wall {statistics.median(wall['gnnpipe']) / statistics.median(wall['PyG']):.3f}, "
          f"thread CPU {statistics.median(cpu['gnnpipe']) / statistics.median(cpu['PyG']):.3f}")


if __name__ == "__main__":
    main()
