"""Per-epoch records as they happen: log lines off a terminal, a CSV file, TensorBoard.

The progress bar (tqdm) is for terminals; in a log file or a pipe a long run needs plain lines.
:class:`EpochLogger` is an ``after_epoch`` hook of :func:`~gnnpipe.core.run.loop.epoch_loop`; only rank 0
of a distributed run has one.
"""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path
from typing import TextIO

from ...errors import ConfigError

#: the columns of ``--log-csv`` (per-rank lists such as ``comm_s`` are summarised by their maximum)
CSV_FIELDS = ["epoch", "loss", "train_acc", "val_acc", "test_acc", "val_loss", "time_s",
              "bytes_layer", "bytes_graph", "bytes_weight", "comm_s", "idle_s"]


#: the columns of ``--log-csv`` of a regression (S2EF) run: energies in eV, forces in eV/Å, EFwT a fraction; a row
#: with ``step`` set is a step record (training by steps: ``epoch`` is the epoch in progress, ``loss`` the step's)
REGRESSION_CSV_FIELDS = ["epoch", "loss", "lr", "train_energy_mae", "train_force_mae", "val_loss", "val_energy_mae",
                         "val_energy_mae_per_atom", "val_force_mae", "val_force_cos", "val_efwt", "test_energy_mae",
                         "test_energy_mae_per_atom", "test_force_mae", "test_force_cos", "test_efwt", "bytes_gp",
                         "time_s", "bytes_weight", "comm_s", "step"]


def regression_csv_fields(splits=()) -> list[str]:
    """:data:`REGRESSION_CSV_FIELDS` with the metrics of each further validation set among ``splits`` (the names
    other than ``train``, ``val`` and ``test``: ``val_ood_ads`` of ``--val-dataset val_ood_ads.lmdb``) after the
    validation ones."""
    extra = [f"{name}_{m}" for name in splits if name not in ("train", "val", "test")
             for m in ("energy_mae", "energy_mae_per_atom", "force_mae", "force_cos", "efwt")]
    at = REGRESSION_CSV_FIELDS.index("test_energy_mae")
    return [*REGRESSION_CSV_FIELDS[:at], *extra, *REGRESSION_CSV_FIELDS[at:]]


#: what TensorBoard receives (the keys a record has; also every ``val_*`` column of the CSV)
_TB_KEYS = ("loss", "train_acc", "val_acc", "test_acc", "val_loss", "time_s", "bytes_layer", "bytes_graph",
            "bytes_weight", *REGRESSION_CSV_FIELDS[2:-4])


def default_log_every(epochs: int) -> int:
    """Every 10 % of the epochs (at least every epoch)."""
    return max(1, epochs // 10)


def _fmt_pct(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"


def format_record(rec: dict, epochs: int) -> str:
    """One log line: epoch, loss, accuracies (evaluated epochs; S2EF: validation energy and force MAE, force
    cosine, and stress MAE where the set has stresses), epoch time and bytes (distributed runs)."""
    s = f"epoch {rec['epoch'] + 1:>{len(str(epochs))}}/{epochs}  loss {rec['loss']:.4f}"
    if "val_force_mae" in rec:
        s += (f"  val E-MAE {rec['val_energy_mae']:.4f} eV ({1000 * rec['val_energy_mae_per_atom']:.2f} meV/atom)"
              f"  F-MAE {rec['val_force_mae']:.4f} eV/Å  F-cos {rec['val_force_cos']:.3f}")
        if "val_stress_mae" in rec:
            s += f"  σ-MAE {1000 * rec['val_stress_mae']:.3f} meV/Å³"
    elif "val_acc" in rec:
        s += (f"  train {_fmt_pct(rec['train_acc'])}  val {_fmt_pct(rec['val_acc'])}"
              f"  test {_fmt_pct(rec['test_acc'])}")
    s += f"  time {rec['time_s'] * 1000:.1f} ms"
    b = sum(rec.get(k, 0) for k in ("bytes_layer", "bytes_graph", "bytes_weight", "bytes_gp"))
    if any(k in rec for k in ("bytes_layer", "bytes_graph", "bytes_weight", "bytes_gp")):
        s += f"  sent {b / 2**20:.2f} MiB"
    return s


def format_step(rec: dict, max_steps=None) -> str:
    """One step line (training by steps): the step (of ``max_steps``), the epoch in progress (counted from 1),
    the step's loss and learning rate, the validation metrics of a step evaluation, the training seconds since
    the previous step line."""
    total = f"/{max_steps:,}" if max_steps else ""
    s = f"step {rec['step']:,}{total} (epoch {rec['epoch'] + 1})  loss {rec['loss']:.4f}  lr {rec['lr']:.3g}"
    if "val_force_mae" in rec:
        s += (f"  val E-MAE {rec['val_energy_mae']:.4f} eV  F-MAE {rec['val_force_mae']:.4f} eV/Å  "
              f"F-cos {rec['val_force_cos']:.3f}"
              + (f"  σ-MAE {1000 * rec['val_stress_mae']:.3f} meV/Å³" if "val_stress_mae" in rec else "")
              + f" ({rec.get('val_size', '?')} structures)")
    return s + f"  time {rec['time_s']:.2f} s"


def _scalar(v):
    if isinstance(v, (list, tuple)):
        return max(v) if v else ""
    return v


def tensorboard_writer():
    """``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        ConfigError: the ``tensorboard`` package is missing (the message says how to install it).
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'gnnpipe[tensorboard]' "
                          "(or pip install tensorboard)") from None
    return SummaryWriter


class EpochLogger:
    """``after_epoch`` hook writing the records of one run.

    Args:
        epochs: the run's ``config.epochs`` (for the ``k/N`` and the default cadence).
        log_every: a line every k epochs (``None``: :func:`default_log_every`; ``0``: no lines); lines go
            to ``stream`` only when it is not a terminal (on a terminal the progress bar shows it),
            plus the last epoch.
        csv_path: append records to this CSV file (header written when the file is new).
        tensorboard: write scalars (loss, accuracies, epoch time, bytes) into this folder.
        stream: where lines go (default ``sys.stdout``).
        fields: the CSV columns (default :data:`CSV_FIELDS`; S2EF: :data:`REGRESSION_CSV_FIELDS`).

    Raises:
        ConfigError: ``tensorboard`` given but the ``tensorboard`` package is missing.
    """

    def __init__(self, epochs: int, log_every: int | None = None, csv_path: str | None = None,
                 tensorboard: str | None = None, stream: TextIO | None = None,
                 fields: list[str] | None = None):
        self.epochs = epochs
        self.stream = stream if stream is not None else sys.stdout
        every = default_log_every(epochs) if log_every is None else int(log_every)
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.tty = tty
        self.every = 0 if tty else every
        self.fields = list(fields or CSV_FIELDS)
        self._tb_keys = tuple(dict.fromkeys((*_TB_KEYS, *(k for k in self.fields if k.startswith("val_")))))
        self._csv_file = None
        self._csv = None
        self._tb = None
        writer = tensorboard_writer() if tensorboard else None  # refused before any file is written
        if csv_path:
            path = Path(csv_path).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            new = not path.exists() or path.stat().st_size == 0
            self._csv_file = open(path, "a", newline="")
            self._csv = csv.DictWriter(self._csv_file, fieldnames=self.fields, extrasaction="ignore")
            if new:
                self._csv.writeheader()
        if writer is not None:
            self._tb = writer(log_dir=str(Path(tensorboard).expanduser()))

    def __call__(self, epoch: int, rec: dict, state=None) -> None:
        if self.every and ((epoch + 1) % self.every == 0 or epoch + 1 == self.epochs):
            try:
                print(format_record(rec, self.epochs), file=self.stream, flush=True)
            except BrokenPipeError:  # e.g. `gnnpipe train ... | head -1`: the reader left; the run goes on, silent
                self.every = 0
                if self.stream is sys.stdout:  # later writes (and the exit's flush) go nowhere instead of failing
                    try:
                        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                    except (OSError, ValueError, AttributeError):
                        pass
        self._write(rec, "", epoch)

    def step(self, rec: dict, max_steps=None, line: bool = True) -> None:
        """A step record (training by steps, :mod:`gnnpipe.tasks.s2ef.steps`): a step line when ``line`` and the
        stream is not a terminal (:func:`format_step`), a CSV row with ``step`` set, TensorBoard scalars
        ``step/<key>`` at the step."""
        if line and not self.tty:
            try:
                print(format_step(rec, max_steps), file=self.stream, flush=True)
            except BrokenPipeError:
                self.tty = True  # the reader left: no more lines
        self._write(rec, "step/", rec["step"])

    def _write(self, rec: dict, tb_prefix: str, x: int) -> None:
        """``rec`` as a CSV row and as TensorBoard scalars ``<tb_prefix><key>`` at ``x`` (the epoch or the step)."""
        if self._csv is not None:
            self._csv.writerow({k: _scalar(rec[k]) for k in self.fields if k in rec})
            self._csv_file.flush()
        if self._tb is not None:
            for k in self._tb_keys:
                v = rec.get(k)
                if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
                    self._tb.add_scalar(f"{tb_prefix}{k}", v, x)

    def close(self) -> None:
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
