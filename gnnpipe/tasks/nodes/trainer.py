"""The exact single-process full-graph trainer (the reference every executor is compared against), and what a
node-classification run builds: the model, its optimizer, the prepared data."""

from __future__ import annotations

import copy
import time

import attrs
import torch

from ...core.run import stopping
from ...core.run.checkpoint import run_meta
from ...core.run.loop import epoch_loop
from ...core.run.results import TrainResult
from ...core.run.session import RunSession
from ...core.run.state import preprocessing_of
from ...core.settings.config import DTYPES, TrainConfig, check_names
from ...data import prepare
from ...models import GNNModel, build_model, get, model_options
from ...models.base import unit_seed
from .graph import GraphOps
from .metrics import accuracies, masked_loss

__all__ = ["DTYPES", "SingleProcessTrainer", "accuracies", "make_model", "make_optimizer", "masked_loss",
           "materialised_units", "resolve_config", "unit_seed"]


def _reinitialisable(model: GNNModel) -> bool:
    """Whether every parameter of the model belongs to a submodule with ``reset_parameters`` (so it can be built
    on the meta device and initialised unit by unit), and the model has no buffers (which ``to_empty`` would
    leave uninitialised)."""
    if any(True for _ in model.buffers()):
        return False
    covered = {id(p) for m in model.modules() if callable(getattr(m, "reset_parameters", None))
               for p in m.parameters(recurse=False)}
    return all(id(p) in covered for p in model.parameters())


def make_model(config: TrainConfig, num_features: int, num_classes: int, units: range | None = None) -> GNNModel:
    """Build the configured model; only the parameters of ``units`` (default: all) are allocated.

    Weights: each unit ``i`` is initialised by its submodules' ``reset_parameters`` right after
    ``torch.manual_seed(unit_seed(config.seed, i))``, so every process that builds unit ``i`` gets the same
    weights whatever other units it builds (a pipeline stage builds only its own). The other units
    stay on the ``meta`` device (shapes without storage). A model whose parameters are not all reachable by
    a ``reset_parameters`` (or that has buffers) cannot be initialised unit by unit: it is built whole on the
    CPU after ``torch.manual_seed(config.seed)``, in every process.

    Args:
        units: the unit indices to materialise (``None``: all).
    """
    kw = dict(num_layers=config.layers, hidden=config.hidden, dropout=config.dropout, bias=config.bias,
              activation=config.activation, **config.model_args)
    with torch.device("meta"):
        model = build_model(config.model, num_features, num_classes, **kw)
    if not _reinitialisable(model):
        torch.manual_seed(config.seed)
        return build_model(config.model, num_features, num_classes, **kw).to(DTYPES[config.dtype])
    for i in range(model.num_units) if units is None else units:
        unit = model.units[i].to_empty(device="cpu")
        torch.manual_seed(unit_seed(config.seed, i))
        for m in unit.modules():
            if callable(getattr(m, "reset_parameters", None)):
                m.reset_parameters()
    return model.to(DTYPES[config.dtype])


def materialised_units(model: GNNModel) -> list[int]:
    """The units whose parameters are allocated (not on the ``meta`` device)."""
    return [i for i, u in enumerate(model.units) if all(p.device.type != "meta" for p in u.parameters())]


def resolve_config(config: TrainConfig) -> TrainConfig:
    """Fill hyper-parameters left ``None`` from the model's ``default_hparams``, and the model options
    not in ``config.model_args`` from their defaults (so that a result records every value used).
    ``recompute="auto"`` (``None``) becomes ``False`` without a pipeline; a pipeline's is decided when it starts
    (:func:`gnnpipe.tasks.nodes.cost.memory_check.choose_recompute`)."""
    resolved = config.resolved(get(config.model).default_hparams)
    opts = {k: o.default for k, o in model_options(config.model).items()}
    if set(opts) - set(resolved.model_args):
        resolved = attrs.evolve(resolved, model_args={**opts, **resolved.model_args})
    if resolved.recompute is None and resolved.stages == 1:  # "auto" means something for a pipeline only
        resolved = attrs.evolve(resolved, recompute=False)
    return resolved


def prepare_data(data, config: TrainConfig):
    """Validate and preprocess ``data`` as ``config`` says: :func:`gnnpipe.data.prepare`
    with ``undirected``, ``remove_self_loops``, ``dedupe`` and ``normalize_features``; values are validated in
    the run's dtype (``config.dtype``), to which ``x`` is cast.

    Raises:
        DataValidationError: a malformed graph (the message names the fix).
    """
    return prepare(data, undirected=config.undirected, remove_self_loops=config.remove_self_loops,
                   dedupe=config.dedupe, normalize_features=config.normalize_features, dtype=config.torch_dtype)


def make_optimizer(model: GNNModel, config: TrainConfig) -> torch.optim.Optimizer:
    """Adam with separate weight decay for GNN layers (``weight_decay_conv``) and dense layers (``weight_decay``)."""
    return torch.optim.Adam(model.param_groups(config.weight_decay, config.weight_decay_conv), lr=config.lr)


def _data_on(data, device: torch.device):
    """A shallow copy of ``data`` with labels and masks on ``device`` (what the loss and metrics read)."""
    out = copy.copy(data)
    for k in ("y", "train_mask", "val_mask", "test_mask"):
        setattr(out, k, getattr(data, k).to(device))
    return out


class SingleProcessTrainer:
    """Exact full-graph training in one process (the reference every layout equals where it is exact).

    The data goes through the same input stage as every other entry point (:func:`prepare_data`:
    validation, then the config's preprocessing: ``undirected``, ``remove_self_loops``, ``dedupe``,
    ``normalize_features``), unless ``prepared=True`` says it already has.

    Args:
        data: a ``Data`` with ``x`` ``[N, F]``, ``y`` ``[N]`` class ids, ``edge_index`` ``[2, E]``,
            ``train_mask`` (``val_mask`` / ``test_mask`` optional: missing ones are empty, with a warning).
        config: the run configuration (``resolve_config`` is applied; its component names are checked
            like every run's, though a single process uses no scheduler, partitioner or corrector).
        model: optional pre-built model (otherwise built from the config with the seed).
        prepared: ``data`` is the output of :func:`prepare_data` with this config (as ``api.train``
            passes it): skip the input stage.

    Raises:
        DataValidationError: malformed data. ConfigError / UnknownComponentError: a bad configuration.
    """

    def __init__(self, data, config: TrainConfig, model: GNNModel | None = None, *, prepared: bool = False):
        check_names(config)
        self.config = resolve_config(config)
        dtype = DTYPES[self.config.dtype]
        self.device = torch.device(self.config.device_type)
        if not prepared:
            data = prepare_data(data, self.config)
        num_classes = int(data.y[data.train_mask | data.val_mask | data.test_mask].max()) + 1
        self.data = data if self.device.type == "cpu" else _data_on(data, self.device)
        self.x = self.data.x.to(self.device, dtype)
        self.ops = GraphOps(data.edge_index, data.num_nodes, dtype, self.device,
                            edge_weight=getattr(data, "edge_weight", None))
        self.model = model if model is not None else make_model(self.config, self.x.size(1), num_classes)
        self.model.to(self.device)
        self.optimizer = make_optimizer(self.model, self.config)
        self.num_train = int(data.train_mask.sum())
        self.num_classes = self.model.units[-1].out_dim
        self.units = range(self.model.num_units)  # the units this executor trains (all)

    def loss_and_backward(self) -> float:
        """One full-graph forward + backward (gradients accumulate into ``.grad``); returns the loss."""
        self.model.train()
        logits = self.model(self.x, self.ops.aggregate)
        loss = masked_loss(logits, self.data.y, self.data.train_mask, self.num_train)
        loss.backward()
        return float(loss.detach())

    def train_epoch(self, epoch: int) -> dict:
        c0 = time.thread_time()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_and_backward()
        self.optimizer.step()
        cpu = time.thread_time() - c0
        return {"loss": loss, "cpu_s": [cpu]}  # CPU time of this thread (s)

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        return accuracies(self.model(self.x, self.ops.aggregate), self.data)

    def fit(self, progress: bool = True, options=None) -> TrainResult:
        """Train; ``options`` (:class:`~gnnpipe.core.settings.options.RunOptions`) selects the weights kept in
        ``result.model``, logging and checkpoints."""
        torch.manual_seed(self.config.seed + 1)
        plan = {"ways": 1, "stages": 1, "chunks": 1, "world_size": 1,
                "num_nodes": int(self.data.num_nodes), "num_edges": int(self.data.edge_index.size(1)),
                "num_units": self.model.num_units, "stage_bounds": [0, self.model.num_units],
                "chunk_sizes": [int(self.data.num_nodes)], "way_ptr": [0, 1]}

        session = RunSession(self.config, options, self, lead=True, plan_info=plan)
        try:
            with stopping.installed():
                result = epoch_loop(self.config, self.train_epoch, self.evaluate, progress=progress,
                                    state=session.start_state(), on_best=session.on_best, after_epoch=session.hooks)
            session.finish()
        finally:
            session.close()
        session.annotate(result, plan, self.x.device)
        model = copy.deepcopy(self.model)  # a pre-built model may not be one the config describes
        model.load_state_dict(session.final_state())
        model.preprocessing = preprocessing_of(self.config)
        model.meta = run_meta(self.config, len(result.epochs))  # saved with it: `gnnpipe predict` finds the data
        result.model = model.eval()
        return result
