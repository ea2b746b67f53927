"""One training epoch of our GCNII-32 (hidden 100) vs a plain PyG GCN2Conv stack of the same shape,
on Amazon Computers, side by side in one run (issue: foundation benchmark).

    python -m pytest benchmarks/bench_gcnii_vs_pyg.py --benchmark-only --benchmark-group-by=group -p no:randomly

or, for the ratio with interleaved repetitions (robust to a noisy shared machine):

    python benchmarks/bench_gcnii_vs_pyg.py [--epochs 10] [--threads 1]
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
L, H, DROPOUT = 32, 100, 0.5
SPARSE = True  # False: PyG with edge_index (scatter-based message passing)


def load():
    from gnnpipe.data import load_dataset, prepare

    return prepare(load_dataset("Computers", SHARED / "amazon"))


class PyGGCNII(nn.Module):
    """The PyG example's GCNII: Linear → L × (dropout, GCN2Conv, ReLU) → dropout → Linear."""

    def __init__(self, f, c, layers=L, hidden=H, dropout=DROPOUT):
        from torch_geometric.nn import GCN2Conv

        super().__init__()
        self.lin0 = nn.Linear(f, hidden)
        self.convs = nn.ModuleList(GCN2Conv(hidden, 0.1, 0.5, l + 1, shared_weights=True, cached=True)
                                   for l in range(layers))
        self.lin1 = nn.Linear(hidden, c)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.dropout(x, self.dropout, self.training)
        x = x0 = F.relu(self.lin0(x))
        for conv in self.convs:
            x = F.dropout(x, self.dropout, self.training)
            x = F.relu(conv(x, x0, adj))
        x = F.dropout(x, self.dropout, self.training)
        return self.lin1(x)


def make_steps(data, device: str = "cpu"):
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer

    ours = SingleProcessTrainer(data, TrainConfig(model="gcnii", layers=L, hidden=H, dropout=DROPOUT, epochs=1,
                                                  device=device), prepared=True)
    c = int(data.y.max()) + 1
    torch.manual_seed(0)
    pyg = PyGGCNII(data.x.size(1), c).to(device)
    opt = torch.optim.Adam(pyg.parameters(), lr=0.01)
    mask = data.train_mask.to(device)
    x, y = data.x.to(device), data.y.to(device)

    from torch_geometric.utils import to_torch_csr_tensor

    # PyG's fastest adjacency input on CPU: a transposed sparse CSR adjacency (``adj_t``), as in its docs
    adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, data.num_nodes)).to(device)
    adj = adj_t if SPARSE else data.edge_index.to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def pyg_step():
        pyg.train()
        opt.zero_grad()
        out = pyg(x, adj)
        F.cross_entropy(out[mask], y[mask]).backward()
        opt.step()
        sync()

    def ours_step():
        ours.train_epoch(0)
        sync()

    pyg_step()  # fills GCN2Conv's normalisation cache, as ours builds Â once
    ours_step()
    return ours_step, pyg_step


def _skip_without_data():
    import pytest

    if not (SHARED / "amazon" / "Computers").is_dir():
        pytest.skip("../shared/data/amazon is absent")


_STEPS = {}


def _steps():
    if not _STEPS:
        torch.set_num_threads(1)
        _STEPS["v"] = make_steps(load())
    return _STEPS["v"]


def test_epoch_gnnpipe_gcnii32(benchmark):
    _skip_without_data()
    benchmark.group = "gcnii32-amazon-computers-epoch"
    ours, _ = _steps()
    benchmark.pedantic(ours, rounds=5, iterations=1, warmup_rounds=1)


def test_epoch_pyg_gcn2conv32(benchmark):
    _skip_without_data()
    benchmark.group = "gcnii32-amazon-computers-epoch"
    _, pyg = _steps()
    benchmark.pedantic(pyg, rounds=5, iterations=1, warmup_rounds=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10, help="timed epochs of each, interleaved")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--edge-index", action="store_true", help="feed PyG edge_index instead of a sparse adj_t")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both models train")
    p.add_argument("--synthetic", type=int, default=0,
                   help="train on a synthetic graph of this many vertices "
                        "(used anyway when Amazon Computers is absent)")
    a = p.parse_args()
    global SPARSE
    SPARSE = not a.edge_index
    torch.set_num_threads(a.threads)
    if a.synthetic or not (SHARED / "amazon" / "Computers").is_dir():
        from gnnpipe.data import prepare, synthetic_graph

        data = prepare(synthetic_graph(num_nodes=a.synthetic or 13752, avg_degree=36.0, num_classes=10,
                                       num_features=767, seed=0))
        name = f"synthetic N={data.num_nodes}"
    else:
        data, name = load(), "Amazon Computers"
    ours, pyg = make_steps(data, a.device)
    t_ours, t_pyg = [], []
    for _ in range(a.epochs):
        for fn, acc in ((ours, t_ours), (pyg, t_pyg)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    mo, mp = statistics.median(t_ours), statistics.median(t_pyg)
    print(f"GCNII-{L} hidden {H} on {name}, {a.device}, {a.threads} thread(s), {a.epochs} interleaved epochs")
    print(f"  gnnpipe  median {mo * 1000:8.1f} ms/epoch")
    print(f"  PyG      median {mp * 1000:8.1f} ms/epoch  ({'edge_index' if a.edge_index else 'sparse CSR adj_t'})")
    print(f"  ratio gnnpipe / PyG = {mo / mp:.3f}")


if __name__ == "__main__":
    main()
