"""The flags of a training run (``gnnpipe train``, ``gnnpipe compare``, study files of ``gnnpipe ablate``).

One parser for one concept: the command line and the experiment runner both read a run's settings
through :func:`add_train_arguments` / :func:`config_from_args`, so the two can never disagree. It lives
below ``experiments`` and ``cli`` (both use it) and above nothing but :mod:`gnnpipe.core.settings.config`.
"""

from __future__ import annotations

import argparse

from ... import models
from .config import TrainConfig

_DEFAULT = TrainConfig()


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``gnnpipe train`` (shared with ``gnnpipe compare``)."""
    d = _DEFAULT
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=None, help="dataset name (Cora, Computers, squirrel, …) or a .pt/.npz file "
                   "(default: the embedded synthetic graph); atomistic: a structure file (.extxyz, .xyz, .traj, .db, "
                   ".aselmdb, .lmdb), a folder of such files, or oc20-like / md17-like / bulk-like (generated; "
                   "bulk-like with stresses; what an atomistic --model trains on without --dataset: oc20-like)")
    g.add_argument("--root", default=None,
                   help="folder holding the dataset the way PyG expects it (e.g. ../shared/data/planetoid)")
    g.add_argument("--split", type=int, default=d.split, help="split index for datasets with several splits")
    g.add_argument("--num-nodes", type=int, default=d.num_nodes, help="synthetic graph: vertices")
    g.add_argument("--avg-degree", type=float, default=d.avg_degree, help="synthetic graph: mean degree")
    g.add_argument("--num-features", type=int, default=d.num_features, help="synthetic graph: feature width")
    g.add_argument("--num-classes", type=int, default=d.num_classes, help="synthetic graph: classes")
    g.add_argument("--normalize-features", action="store_true",
                   help="row-normalise features to sum 1 (PyG NormalizeFeatures; the GCN/GCNII papers' Planetoid "
                        "preprocessing)")
    g.add_argument("--no-undirected", dest="undirected", action="store_false",
                   help="keep edge directions (default: make the graph undirected)")
    g.add_argument("--keep-self-loops", dest="remove_self_loops", action="store_false",
                   help="keep self-loops (default: remove them)")
    m = p.add_argument_group("model")
    m.add_argument("--model", default=d.model, help="model name (gnnpipe.models.available())")
    m.add_argument("--layers", type=int, default=d.layers,
                   help="number of GNN layers L (default: %(default)s; atomistic models: their S2EF recipe, "
                        "gnnpipe.tasks.s2ef.defaults)")
    m.add_argument("--hidden", type=int, default=d.hidden,
                   help="hidden width (default: %(default)s; atomistic models: their S2EF recipe)")
    m.add_argument("--dropout", type=float, default=None, help="dropout probability (default: the model's)")
    m.add_argument("--bias", action=argparse.BooleanOptionalAction, default=d.bias, help="bias in the GNN layers")
    m.add_argument("--activation", default=d.activation, help="activation function")
    m.add_argument("--model-arg", dest="model_args", action="append", default=None, metavar="NAME=VALUE",
                   help="one of the model's own options (repeatable; `gnnpipe models` lists them): "
                   + _model_options_help())
    o = p.add_argument_group("optimisation")
    o.add_argument("--lr", type=float, default=None,
                   help="Adam learning rate (default: the model's; atomistic models: its S2EF recipe)")
    o.add_argument("--weight-decay", type=float, default=None,
                   help="weight decay of dense layers (default: the model's)")
    o.add_argument("--weight-decay-conv", type=float, default=None,
                   help="weight decay of GNN layers (default: the model's)")
    o.add_argument("--epochs", type=int, default=d.epochs, help="maximum number of epochs")
    o.add_argument("--patience", type=int, default=d.patience, help="early-stopping patience in epochs (0 = off)")
    o.add_argument("--eval-every", type=int, default=d.eval_every, help="evaluate every k epochs")
    o.add_argument("--seed", type=int, default=d.seed, help="random seed")
    o.add_argument("--nan-ok", action="store_true",
                   help="keep training after an epoch whose loss is NaN or infinite (default: stop the run there)")
    o.add_argument("--dtype", default=d.dtype, choices=["float32", "float64"], help="floating dtype")
    o.add_argument("--history-dtype", default=None, choices=["float32", "bfloat16", "float16", "float64"],
                   help="storage dtype of the pipeline's history buffers (rows up-cast to --dtype when read; "
                        "default: --dtype)")
    par = p.add_argument_group("parallelism")
    par.add_argument("--ways", type=int, default=d.ways,
                     help="graph-parallel ways W: the graph's vertices split over W ranks (node classification; for an "
                          "atomistic run, --ways is the old spelling of --replicas)")
    par.add_argument("--replicas", type=int, default=d.replicas,
                     help="data-parallel replicas D (atomistic S2EF), each reading --batch-size structures per step")
    par.add_argument("--stages", type=int, default=d.stages,
                     help="pipeline stages S (atomistic S2EF: the model's embedding and interaction blocks split over "
                          "S stages; ranks = --replicas D x S x --gp-size G)")
    par.add_argument("--chunks", type=int, default=None,
                     help="total number of chunks C (default: 4·S per way; 1 per way when S = 1; atomistic S2EF: "
                          "micro-batches of whole structures per replica batch, min(4·S, --batch-size))")
    par.add_argument("--scheduler", default=d.scheduler,
                     help="chunk scheduler: 1f1b (default), gpipe, async-stale, … (S2EF: a flush scheduler; gpipe or "
                          "1f1b for conservative forces)")
    par.add_argument("--stash-weights", action="store_true",
                     help="non-flush schedulers: back-propagate each chunk at the weights its forward used")
    par.add_argument("--correctors", default=",".join(d.correctors),
                     help="comma-separated staleness correctors (t1,t2,t3,ema,…; 'none' for none)")
    par.add_argument("--partitioner", default=d.partitioner, help="vertex partitioner for chunks / parts")
    par.add_argument("--over-partition", type=int, default=d.over_partition,
                     help="METIS over-partitioning factor k for chunks (the paper: 4)")
    par.add_argument("--layer-split", default=d.layer_split, help="layer-to-stage split: equal | profiled")
    par.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                     help="recompute stage activations in the backward (memory for compute); default: auto — on when "
                          "the memory model predicts the largest pipeline rank would otherwise hold more than graph "
                          "parallelism over the same ranks (the plan printed at start says which and why)")
    par.add_argument("--threads", type=int, default=d.threads, help="torch threads per rank")
    par.add_argument("--device", default=None, choices=["cpu", "cuda"],
                     help="where every rank computes (default: cuda when available); ranks sharing a GPU talk over "
                          "gloo through pinned CPU buffers")
    par.add_argument("--amp", action="store_true",
                     help="atomistic S2EF: the model's forward in bfloat16 autocast (energies, forces, losses and the "
                          "optimizer state stay float32; conservative forces by autograd through the autocast graph); "
                          "needs --dtype float32")
    par.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=d.tf32,
                     help="atomistic S2EF on a GPU: allow TF32 matmuls and convolutions for float32 work (default: "
                          "on; --no-tf32 keeps float32 matmuls exact)")
    par.add_argument("--backend", default=None,
                     help="torch.distributed backend gloo | nccl (default: nccl with one CUDA GPU per rank, else gloo: "
                          "on the CPU, or with --device cuda through pinned CPU buffers)")
    par.add_argument("--timeout", dest="timeout_s", type=float, default=d.timeout_s,
                     help="wait limit: seconds a rank may wait on a live peer before the run is ended as hung "
                          "(default: derived, printed in the plan: torch's 1800 for gloo, 600 for nccl, or 10 x the "
                          "cost model's predicted epoch with --layout auto when longer); a rank that dies ends the run "
                          "at once, a slow one does not")
    a = p.add_argument_group("atomistic: structure to energy and forces (S2EF; --replicas D data-parallel replicas)")
    a.add_argument("--energy-coef", type=float, default=d.energy_coef,
                   help="weight of the energy loss (default: the model's S2EF recipe, else %(default)s)")
    a.add_argument("--force-coef", type=float, default=d.force_coef,
                   help="weight of the force loss (default: the model's S2EF recipe, else %(default)s)")
    a.add_argument("--loss", dest="loss_fn", choices=["l1", "mse"], default=d.loss_fn,
                   help="loss per energy and force component: mean absolute (l1) or mean squared error (mse)")
    a.add_argument("--direct-forces", action="store_true",
                   help="forces from the model's force head (default: conservative, minus the energy's gradient)")
    a.add_argument("--cutoff", type=float, default=d.cutoff,
                   help="neighbour cutoff radius in Å (default: the model's S2EF recipe, else %(default)s)")
    a.add_argument("--max-neighbors", type=int, default=d.max_neighbors,
                   help="at most this many (the nearest) neighbours per atom (default: the model's S2EF "
                        "recipe, else %(default)s)")
    a.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="structures per step and rank (default: the model's S2EF recipe, else %(default)s)")
    a.add_argument("--ema-decay", type=float, default=d.ema_decay,
                   help="decay of the moving average of the weights used for evaluation (0: off)")
    a.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="steps of linear learning-rate warm-up")
    a.add_argument("--warmup-factor", type=float, default=d.warmup_factor,
                   help="learning rate at the start of the warm-up, as a fraction of --lr")
    a.add_argument("--lr-schedule", choices=["cosine", "plateau", "constant"], default=d.lr_schedule,
                   help="after the warm-up: cosine decay to 1%% of --lr over the run, x0.8 when the validation force "
                        "MAE stalls for 3 evaluations (plateau), or constant")
    a.add_argument("--clip-grad-norm", type=float, default=d.clip_grad_norm, help="gradient-norm clipping (0: off)")
    a.add_argument("--energy-key", default=None, help="the energy label of a structure file (default: the "
                   "calculator's energy)")
    a.add_argument("--forces-key", default=None, help="the force label of a structure file (default: the "
                   "calculator's forces)")
    a.add_argument("--stress-coef", type=float, default=d.stress_coef,
                   help="weight of the stress term of the loss (structures with a stress label; conservative forces "
                        "only; 0: stresses are only reported)")
    a.add_argument("--stress-key", default=None, help="the stress label of a structure file (default: stress, or "
                   "the calculator's)")
    a.add_argument("--virial-key", default=None, help="the virial label of a structure file, read as −virial / volume "
                   "where there is no stress (default: virial)")
    a.add_argument("--val-dataset", dest="val_datasets", action="append", default=None, metavar="FILE",
                   help="a given validation set (any format --dataset takes; repeatable: each is reported under its "
                        "own name, the first chooses the best weights); with it or --test-dataset, --dataset is the "
                        "training set whole instead of being split 80/10/10")
    a.add_argument("--test-dataset", default=None, metavar="FILE",
                   help="a given test set (reported at the best validation)")
    a.add_argument("--energy-reference", default=d.energy_reference, metavar="linear|none|FILE",
                   help="the per-element energy reference subtracted from the targets: linear (least squares on "
                        "the training split), none (train the energies as given, e.g. adsorption energies), or a file "
                        "of per-element energies (fairchem's element_references .pt / .npz, or .json / .toml "
                        "{element: eV})")
    a.add_argument("--frames", type=int, default=d.frames,
                   help="frames of the generated oc20-like / md17-like / bulk-like set")
    a.add_argument("--num-workers", type=int, default=None,
                   help="loader worker processes per rank that read, validate and build each batch's graph ahead of "
                        "the step (0: in the training process; default: the cores left after the ranks, at most 4)")
    a.add_argument("--skip-invalid", action="store_true",
                   help="skip a malformed structure and count it in the epoch record (default: stop the run naming "
                        "its file, index and problem)")
    a.add_argument("--gp-size", dest="graph_parallel_group_size", type=int, default=d.graph_parallel_group_size,
                   help="graph-parallel group size G: each replica's batch (each stage's, with --stages S) split "
                        "over G ranks by its edges and triplets (ranks = --replicas D x --stages S x G)")
    a.add_argument("--gp-partitioner", dest="graph_parallel_partitioner", default=d.graph_parallel_partitioner,
                   help="how a graph-parallel group splits the graph: edge-chunk (contiguous edge ranges balanced "
                        "by triplet counts) or atom-owner (each edge with its target atom's owner, Morton order)")
    a.add_argument("--gp-mode", dest="graph_parallel_mode", choices=["allgather", "halo"],
                   default=d.graph_parallel_mode,
                   help="how a graph-parallel group moves the edge rows triplets read: every edge (allgather) or "
                        "only the rows read (halo)")
    a.add_argument("--max-steps", type=int, default=None,
                   help="stop after N optimizer steps (or --epochs, whichever comes first), with the result and "
                        "checkpoint as at the end of an epoch; the learning-rate warm-up and cosine decay span these N "
                        "steps")
    a.add_argument("--eval-every-steps", type=int, default=None,
                   help="evaluate every k optimizer steps (and at --max-steps) on the first --val-size structures "
                        "of the validation and test splits (needs a validation split)")
    a.add_argument("--val-size", type=int, default=None,
                   help="structures of the validation (and test) split a step evaluation reads (default: 1000; "
                        "the whole split when smaller)")


def _model_options_help() -> str:
    return "; ".join(f"{name}: {models.describe_options(name)}" for name in models.available())


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``gnnpipe train`` flags (``--model-arg`` values typed by the model).

    Raises:
        ConfigError, UnknownComponentError: a bad value, an unknown model or model option.
    """
    fields = {a.name for a in TrainConfig.__attrs_attrs__}
    kw = {k: v for k, v in vars(args).items() if k in fields}
    if kw.get("model_args") is not None and not isinstance(kw["model_args"], dict):
        kw["model_args"] = models.parse_model_args(kw.get("model", _DEFAULT.model), kw["model_args"])
    return TrainConfig(**kw)  # the config parses the --correctors string (correctors.parse_spec)
