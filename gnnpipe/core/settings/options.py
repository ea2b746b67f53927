"""Run options: how a run is watched, saved and resumed — settings that never change its numbers.

Apart from :class:`~gnnpipe.core.settings.config.TrainConfig` (everything the trained numbers depend on, stored in
the result and compared on ``--resume``), these are free to differ between a run and its continuation.
"""

from __future__ import annotations

import attrs

from ...errors import ConfigError


def _keep(inst, attr, value):
    if value not in ("best", "last"):
        raise ConfigError(f"keep must be 'best' (the weights of the best-validation epoch) or 'last', got {value!r}")


def _nonneg_int(inst, attr, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"{attr.name.replace('_', '-')} must be an integer >= 0, got {value!r}")


@attrs.define(kw_only=True)
class RunOptions:
    """Options of one run that do not change what it computes.

    Attributes:
        keep: which weights ``result.model`` holds: ``"best"`` (of the evaluation with the best validation
            accuracy, the one ``test_acc_at_best_val`` reports; the last epoch's when no evaluation
            improved) or ``"last"``.
        log_every: print one line every k epochs when stdout is not a terminal (``None``: every 10 % of
            the epochs; ``0``: never).
        log_csv: append each epoch record to this CSV file. tensorboard: write the records to this folder
            with ``torch.utils.tensorboard``.
        checkpoint_dir: write checkpoints into this folder (``torch.distributed.checkpoint``), every
            ``checkpoint_every`` epochs (``0``: only at the end) and at the end.
        checkpoint_every_steps: also every k optimizer steps, inside epochs (S2EF; ``0``: off): a resume
            continues at the next batch, exactly.
        log_every_steps: a step line (and a step record in the result) every k optimizer steps when stdout is
            not a terminal (S2EF; ``None``: every 10 % of ``--max-steps``, at most every 1000 steps, when it is
            given and ``log_every`` is not ``0``, else never; ``0``: never).
        resume: continue the run of this checkpoint folder (or one ``ckpt-*`` folder in it).
        memory_check: refuse a run that the memory model says cannot fit in the memory available here,
            before it starts: a single process
            (:func:`gnnpipe.tasks.nodes.cost.memory_check.check_single_process_memory`) or the ranks started on this
            machine together (:func:`~gnnpipe.tasks.nodes.cost.memory_check.check_ranks_memory`; CPU ranks)
            (``False``: try anyway).
    """

    keep: str = attrs.field(default="best", validator=_keep)
    log_every: int | None = attrs.field(default=None, validator=_nonneg_int)
    log_csv: str | None = None
    tensorboard: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = attrs.field(default=0, validator=_nonneg_int)
    checkpoint_every_steps: int = attrs.field(default=0, validator=_nonneg_int)
    log_every_steps: int | None = attrs.field(default=None, validator=_nonneg_int)
    resume: str | None = None
    memory_check: bool = True
