"""What a pipeline stage declares to the schedule interpreter (:class:`~gnnpipe.core.runtime.execute.Executor`).

A stage computes; the interpreter owns the loop over a schedule's actions and every message between stages. For
each action the interpreter asks the stage what it receives (:meth:`PipelineStage.recv_shape`), hands it the
received tensor, and sends what the stage returns::

    F c     x   = recv(s−1)  if recv_shape("F", c)      y  = forward_chunk(c, x, e)       send y  → s+1
    B c     g   = recv(s+1)  if recv_shape("B", c)      gx = backward_chunk(c, g, e)      send gx → s−1
    G c     g   = recv(s+1)  if recv_shape("G", c)      out = force_grad_chunk(c, g, e)   send    → s−1
    D c     g   = recv(s−1)  if recv_shape("D", c)      out = second_chunk(c, g, e)       send    → s+1
    STEP    the executor's gradient synchronisation, then step()

``G`` and ``D`` are the passes of second-order schedules (training through conservative forces, a backward of a
backward); a stage that does not run them leaves them unimplemented and is never given such a schedule. Each kind
of work subclasses :class:`PipelineStage` (node classification: rows of a graph's vertices; S2EF: micro-batches of
structures); the interpreter reads nothing else of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

__all__ = ["PipelineStage"]


class PipelineStage(ABC):
    """One rank's stage of a pipeline, as the schedule interpreter drives it.

    Attributes (set by the subclass):
        s: this stage's index ``0 … S−1``. is_first, is_last: ``s == 0``, ``s == S − 1``.
        device: where its tensors live. dtype: the dtype of the boundary tensors it receives.
        version: optimizer steps taken (the weight version; staleness is measured in it).
        params: the parameters this stage trains (its optimizer's).
        histories: the stage's history buffers by name, for staleness correctors (empty: none).
    """

    s: int
    is_first: bool
    is_last: bool
    device: torch.device
    dtype: torch.dtype
    version: int = 0
    histories: dict = {}

    @abstractmethod
    def recv_shape(self, kind: str, c: int) -> tuple | None:
        """The shape of the tensor action ``kind`` (``"F"``, ``"B"``, ``"G"``, ``"D"``) on chunk ``c`` receives,
        or ``None`` when it receives nothing (the first stage's ``F``, the last stage's ``B``, an empty chunk)."""

    @abstractmethod
    def forward_chunk(self, c: int, x: Tensor | None, epoch: int) -> Tensor | None:
        """``F``: compute chunk ``c`` from the received ``x``; returns what to send to ``s + 1`` (``None``:
        nothing)."""

    @abstractmethod
    def backward_chunk(self, c: int, grad: Tensor | None, epoch: int) -> Tensor | None:
        """``B``: back-propagate chunk ``c`` from the received output gradient; returns the input gradient to send to
        ``s − 1`` (``None``: nothing)."""

    def force_grad_chunk(self, c: int, g: Tensor | None, epoch: int) -> Tensor | None:
        """``G`` (second-order schedules): returns what to send to ``s − 1``."""
        raise NotImplementedError(f"{type(self).__name__} runs no second-order schedule (G passes)")

    def second_chunk(self, c: int, g: Tensor | None, epoch: int) -> Tensor | None:
        """``D`` (second-order schedules): returns what to send to ``s + 1``."""
        raise NotImplementedError(f"{type(self).__name__} runs no second-order schedule (D passes)")

    @abstractmethod
    def zero_grad(self) -> None:
        """Clear the gradients before a flush schedule's epoch (or step)."""

    @abstractmethod
    def step(self) -> None:
        """One optimizer step (after the executor's gradient synchronisation); a new weight version."""

    @abstractmethod
    def pending(self) -> list[int]:
        """Chunks forwarded but not yet back-propagated (empty at the end of a flush schedule)."""

    @abstractmethod
    def pop_loss(self, epoch: int) -> float:
        """This stage's part of the loss of ``epoch``'s chunks (reset to 0)."""
