"""History buffers and the chunk aggregation op with a pull-based backward.

For aggregation op ``k`` on a stage, :class:`History` holds two full-graph buffers:

* ``H_in``  (``[N, d]``): the op's input rows; rows of chunks already processed at this stage in this
  epoch are fresh, the others hold older values (stale; zeros before first use);
* ``G_out`` (``[N, d]``): the gradient of the op's output rows, the same way.

:class:`ChunkAggregate` is the op itself: forward writes ``H_in[R_c] ← x_c`` and returns
``Â[R_c, :] @ H_in``; backward writes ``G_out[R_c] ← g`` and returns ``Âᵀ[R_c, :] @ G_out`` — the
*pull*: the gradient reaching chunk c's input is summed over all of its out-neighbours' output
gradients (fresh for chunks already back-propagated, stale/zero otherwise). Plain autograd through
``Â[R_c, :] @ H_in`` would drop every cross-chunk gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .graph import CompactRows, spmm


class History:
    """The two full-graph buffers of one aggregation op (``H_in``, ``G_out``), allocated on first use.

    ``H_in`` and ``G_out`` are views of the first ``N`` rows of ``(N + 1)``-row buffers whose last rows stay zero. While
    every change to ``G_out`` goes through :meth:`zero_grads`, :meth:`write_grad_rows` and
    :meth:`scale_grad_rows`, the history knows which rows are zero (e.g. after T2's epoch-end zeroing, the
    rows of chunks not back-propagated yet this epoch) and the pull reads the zero row in their place
    instead of fetching cold rows of zeros (:meth:`pull_source`, :meth:`grad_source`). Any other in-place change
    of ``G_out`` bumps its version counter, and the history then treats no row as known zero (exact either way).
    What is known is kept as a *redirect* table (integer ``[N]``): row ``v`` of ``G_out`` is read from row
    ``redirect[v]`` of the ``(N + 1)``-row buffer, ``v`` itself or ``N`` (the zero row), so that the pull renumbers a
    chunk's columns in one gather.

    With :attr:`release_grads` (set by a stage that recomputes, ``--recompute``: memory before compute), a
    ``G_out`` zeroed by :meth:`zero_grads` (T2 at every epoch's end) holds nothing but zeros until the next
    backward writes a row: its buffer is then released and allocated again, zero, on first use (reading
    ``G_out`` allocates it), so that it costs no memory while the run evaluates between epochs (the
    evaluation is a pipeline rank's peak). Otherwise it is zeroed in place: allocating it again every epoch costs
    page faults that a pipeline's epoch feels (docs/RESULTS.md §11c).

    Row blocks ``buf[start:end]`` the chunk op and T2 write are views made once per chunk and buffer
    (:meth:`rows_of`), not sliced again every chunk action.

    What the runtime does not do, since it would only move bytes: :meth:`zero_grads` (T2) and
    :meth:`zero_inputs` (T3's restore before its first snapshot) do not write the zeros — every row becomes *known
    zero*, the chunk op reads the buffer's zero row (row ``N``) in its place, and a chunk's own pass overwrites its
    rows anyway; the memory is zeroed only when ``G_out`` or ``H_in`` itself is read (the properties, a checkpoint, a
    product without the redirect). So read the buffers through the properties: a tensor kept from before a zeroing
    shows old values in the rows known zero (as a ``G_out`` released by :attr:`release_grads` is no longer the
    history). And with :attr:`scale_after_pull` set (T2: 2), the pull multiplies the rows it just wrote by it right
    after its product, while they are in the cache, instead of T2 reading them back after the chunk's backward
    (:meth:`take_scaled`). All of it gives the same values bit for bit.

    Args:
        num_nodes: ``N``. dtype: buffer dtype. name: label used in reports (e.g. ``"unit3.op0"``).
    """

    def __init__(self, num_nodes: int, dtype: torch.dtype = torch.float32, name: str = "",
                 device: torch.device | str = "cpu"):
        self.num_nodes = num_nodes
        self.dtype = dtype
        self.device = torch.device(device)
        self.name = name
        self._h_view: Tensor | None = None  # H_in (the property): _h_buf[:N], or a tensor a subclass assigned
        self._h_buf: Tensor | None = None  # [N + 1, d], last row zero (None when H_in was assigned directly)
        self._h_redirect: Tensor | None = None  # int [N]: v, or N for a row of H_in known zero (zero_inputs)
        self._h_lazy = False  # rows known zero may hold old values (zero_inputs did not write them)
        self._h_zero_rows = 0  # rows still known zero while lazy
        self._h_key: frozenset = frozenset()  # (start, end) of the blocks of H_in written since zero_inputs
        self._g_view: Tensor | None = None  # G_out = _g_buf[:N]
        self._g_buf: Tensor | None = None  # [N + 1, d]; None before first use and while released (all zero)
        self._g_redirect: Tensor | None = None  # int [N]: v, or N for a row of G_out known to be zero
        self._g_known = -1  # G_out's version counter when _g_redirect was last valid (-1: nothing known)
        self._g_key: frozenset = frozenset()  # (start, end) of the blocks of G_out written while tracking
        self._views: dict = {}  # (id(buffer), start, end) -> buffer[start:end] (a view keeps its buffer alive)
        self._g_stale = False  # rows known zero may still hold old values in memory (zero_grads did not write them)
        #: release a zeroed G_out until its next use instead of zeroing it in place (class docstring)
        self.release_grads = False
        #: a factor the pull applies to the ``G_out`` rows it wrote, right after its product (T2's doubling: 2.0)
        self.scale_after_pull: float | None = None
        self._scaled: set = set()  # start rows of chunks whose rows the pull scaled (until take_scaled)
        #: ``{chunk start row: tensor}``, or ``None``: what each chunk's forward read of this history, kept for its
        #: recomputation (:meth:`recall`; set by a stage that recomputes under a flush schedule)
        self.kept: dict | None = None

    def recall(self, start: int, write: bool, read, copy: bool = False) -> Tensor:
        """What the chunk op of the chunk starting at row ``start`` reads of this history: ``read()``, except
        that with :attr:`kept` set the forward (``write=True``) keeps it (a copy with ``copy``: a result the caller
        may change in place) and the chunk's recomputation in its backward (``write=False``) gets the kept tensor
        instead of reading again. Later chunks' forwards have written history since; the recomputed forward must
        see the values the forward saw, or the gradient is taken at other activations than the loss (
        the forward returns ``Â[R_c, :] @ H_in`` as ``H_in`` is then).

        Returns:
            the tensor ``read()`` returns (its shape and dtype).
        """
        kept = self.kept
        if kept is None:
            return read()
        if write:
            out = read()
            kept[start] = out.clone() if copy else out
            return out
        out = kept.pop(start, None)
        return read() if out is None else out

    def ensure(self, dim: int) -> None:
        """Allocate zero buffers of width ``dim`` if not yet allocated."""
        if self._h_view is None:
            self._h_buf = torch.zeros(self.num_nodes + 1, dim, dtype=self.dtype, device=self.device)
            self._h_view = self._h_buf[: self.num_nodes]
            idx = torch.int32 if self.num_nodes < 2**31 - 1 else torch.int64
            self._g_redirect = torch.empty(self.num_nodes, dtype=idx, device=self.device)
            self._allocate_grads()
            self._g_known = -1

    @property
    def allocated(self) -> bool:
        """Whether the buffers exist (the op has run), without reading them."""
        return self._h_view is not None

    @property
    def H_in(self) -> Tensor | None:
        """``[N, d]`` input buffer (``None`` before first use); rows known zero after :meth:`zero_inputs` are zero in
        memory when it is read here."""
        if self._h_lazy:
            self._write_input_zeros()
        return self._h_view

    @H_in.setter
    def H_in(self, value: Tensor | None) -> None:
        self._h_lazy = False
        self._h_buf = None
        self._h_view = value
        self._views.clear()

    def zero_inputs(self) -> None:
        """``H_in ← 0`` (T3's restore before its first snapshot). Lazily where the chunk op can read around it: every
        row becomes known zero and the push reads it from the zero row until its chunk writes it (no pass
        over the buffer, and stale reads of the zeros cost nothing); ``H_in`` itself is zeroed when it is read."""
        if self._h_view is None:
            return
        if self._h_buf is None:  # assigned directly (a subclass): no zero row to read from
            self._h_view.zero_()
            return
        if self._h_redirect is None:
            self._h_redirect = torch.empty(self.num_nodes, dtype=self._g_redirect.dtype, device=self.device)
        self._h_redirect.fill_(self.num_nodes)
        self._h_lazy = True
        self._h_zero_rows = self.num_nodes
        self._h_key = frozenset()

    def _inputs_written(self, start: int, end: int) -> None:
        """Rows ``[start, end)`` of ``H_in`` were written by the chunk op: read them in place from now on."""
        if (start, end) in self._h_key:
            return
        self._h_key = self._h_key | {(start, end)}
        self._h_zero_rows -= end - start
        if self._h_zero_rows <= 0:  # every row written since zero_inputs: nothing left to read around
            self._h_lazy = False
            self._h_key = frozenset()
            return
        torch.arange(start, end, out=self.rows_of(self._h_redirect, start, end))

    def _write_input_zeros(self) -> None:
        """Make the rows known zero zero in memory too (after a :meth:`zero_inputs` that did not write them)."""
        self._h_lazy = False
        self._zero_known_rows(self._h_view, self._h_redirect)
        self._h_key = frozenset()

    def _zero_known_rows(self, view: Tensor, redirect: Tensor) -> None:
        """``view[v] ← 0`` for every row the redirect table marks known zero (``redirect[v] == N``)."""
        zero = redirect == self.num_nodes
        if bool(zero.all()):
            view.zero_()
        else:
            view[zero] = 0

    @property
    def inputs_in_place(self) -> frozenset:
        """The state of :meth:`push_source`'s redirect table: the ``(start, end)`` blocks of ``H_in`` written since
        :meth:`zero_inputs` (read in place; every other row is known zero). Two histories with the same blocks have
        the same table (a pure function of the blocks; :meth:`gnnpipe.tasks.nodes.graph.CompactRows.redirected_col` keys
        on it). Meaningful while the table is given."""
        return self._h_key

    @property
    def grads_in_place(self) -> frozenset:
        """The state of :meth:`pull_source`'s redirect table: the ``(start, end)`` blocks of ``G_out`` written since
        every row became known zero (read in place; every other row is known zero), as :attr:`inputs_in_place`."""
        return self._g_key

    def push_source(self) -> tuple[Tensor, Tensor | None]:
        """What the push's product reads: ``(H, redirect)`` with ``H`` the ``[N + 1, d]`` buffer and the redirect table
        while rows are known zero (:meth:`zero_inputs`), else ``(H_in, None)``."""
        if self._h_lazy:
            return self._h_buf, self._h_redirect
        return self._h_view, None

    def _allocate_grads(self) -> None:
        """A zero ``G_out`` buffer (every row known zero)."""
        self._views.clear()
        self._g_buf = torch.zeros(self.num_nodes + 1, self._h_view.size(1), dtype=self.dtype, device=self.device)
        self._g_view = self._g_buf[: self.num_nodes]
        self._g_redirect.fill_(self.num_nodes)
        self._g_key = frozenset()
        self._g_known = self._g_view._version
        self._g_stale = False

    def _grads(self) -> Tensor:
        """The ``[N, d]`` view of the buffer as the chunk op uses it (allocated if released; rows known zero may hold
        old values: read them through the redirect table)."""
        if self._g_buf is None:
            self._allocate_grads()
        return self._g_view

    def _write_zeros(self) -> None:
        """Make the rows known zero zero in memory too (after a :meth:`zero_grads` that did not write them)."""
        if not self._g_stale:
            return
        self._g_stale = False
        self._zero_known_rows(self._g_view, self._g_redirect)
        self._g_known = self._g_view._version  # what is known zero is still known

    @property
    def G_out(self) -> Tensor | None:
        """``[N, d]`` output-gradient buffer (``None`` before first use); a released, all-zero one is allocated
        again here, and rows known zero are zero in memory when it is read here (class docstring)."""
        if self._h_view is None:
            return None
        self._grads()
        self._write_zeros()
        return self._g_view

    @property
    def grads_released(self) -> bool:
        """``G_out`` is all zero and holds no memory (until it is read or written)."""
        return self._h_view is not None and self._g_buf is None

    @staticmethod
    def write_rows(buf: Tensor, start: int, rows: Tensor) -> None:
        """``buf[start:start + len(rows)] ← rows`` (in place, no autograd)."""
        buf[start : start + rows.size(0)] = rows

    def rows_of(self, buf: Tensor, start: int, end: int) -> Tensor:
        """``buf[start:end]`` (a view of one of this history's buffers), made once per buffer and row block."""
        key = (id(buf), start, end)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = buf[start:end]
        return view

    # ------------------------------------------------------------------ G_out with known zero rows
    def _tracking(self) -> bool:
        if self._h_view is None:
            return False
        g = self._grads()
        return self._g_known == g._version and g.data_ptr() == self._g_buf.data_ptr()

    def zero_grads(self) -> None:
        """``G_out ← 0`` (e.g. T2 at the end of an epoch); every row is then known to be zero (with
        :attr:`release_grads`, the buffer is released until its next use; otherwise the zeros are written only when
        ``G_out`` is read: class docstring)."""
        self._scaled.clear()
        if self._h_view is None or self._g_buf is None:
            return
        if self.release_grads:
            self._g_buf = self._g_view = None
            self._views.clear()  # the cached row views would keep the released buffer alive
            self._g_redirect.fill_(self.num_nodes)
            self._g_key = frozenset()
            self._g_stale = False
            return
        self._g_redirect.fill_(self.num_nodes)
        self._g_key = frozenset()
        self._g_known = self._g_view._version
        self._g_stale = True  # not written: every read of these rows goes through the redirect or G_out

    def write_grad_rows(self, start: int, g: Tensor, scale: float | None = None) -> bool:
        """``G_out[start:start + len(g)] ← g`` (``scale · g`` with a scale; the chunk op's backward). Returns whether
        the known zero rows are still tracked (then :meth:`pull_source` gives the redirect table)."""
        tracking = self._tracking()
        if not tracking:  # a change behind the history's back turned tracking off: the pull will read G_out in
            self._write_zeros()  # place, so rows known zero must be zero in memory first
        end = start + g.size(0)
        dst = self.rows_of(self._g_view, start, end)
        if scale is None:
            dst.copy_(g)
        else:
            torch.mul(g, scale, out=dst)
        if tracking:
            torch.arange(start, end, out=self.rows_of(self._g_redirect, start, end))  # these rows: read in place
            self._g_known = self._g_view._version
            if (start, end) not in self._g_key:
                self._g_key = self._g_key | {(start, end)}
        return tracking

    def scale_grad_rows(self, start: int, end: int, factor: float) -> None:
        """``G_out[start:end] *= factor`` (e.g. T2's doubling); known zero rows stay zero."""
        if self._h_view is None or self._g_buf is None:  # nothing yet, or all zero
            return
        tracking = self._tracking()
        self.rows_of(self._g_view, start, end).mul_(factor)  # not `G[a:b] *= f`: that also copies the rows
        if tracking:
            self._g_known = self._g_view._version

    def pull_source(self, tracking: bool | None = None) -> tuple[Tensor, Tensor | None]:
        """What the pull reads: ``(G, redirect)`` with ``G`` the ``[N + 1, d]`` buffer (row ``N`` is zero) and
        ``redirect`` the integer ``[N]`` table (row ``v`` is read from row ``redirect[v]``: ``v``, or ``N`` for a row
        known to be zero), or ``(G_out, None)`` when nothing is known. ``tracking``: what :meth:`write_grad_rows` just
        returned (not checked again)."""
        if self._tracking() if tracking is None else tracking:
            return self._g_buf, self._g_redirect
        return self.G_out, None

    def grad_source(self) -> tuple[Tensor, Tensor | None]:
        """``(G, zero)``: as :meth:`pull_source`, with the bool ``[N]`` mask of rows known to be zero in place of the
        redirect table (``None`` when nothing is known); the rows it marks are zero in ``G`` too."""
        if self._h_view is not None:
            self._write_zeros()
        g, redirect = self.pull_source()
        return g, (None if redirect is None else redirect == self.num_nodes)

    def take_scaled(self, start: int) -> bool:
        """Whether the pull already applied :attr:`scale_after_pull` to the rows of the chunk starting at row
        ``start`` (since the last :meth:`zero_grads`); forgets it (T2 then does not scale them again)."""
        if start in self._scaled:
            self._scaled.discard(start)
            return True
        return False

    def state_tensors(self) -> dict[str, Tensor]:
        """The buffers a checkpoint saves (:mod:`gnnpipe.core.run.checkpoint`): ``{"H_in", "G_out"}``, or ``{}``
        before the first use."""
        if self.H_in is None:
            return {}
        if self._g_buf is None:  # released (all zero): zeros for the file, not kept
            return {"H_in": self.H_in, "G_out": torch.zeros_like(self.H_in)}
        return {"H_in": self.H_in, "G_out": self.G_out}

    def load_state_tensors(self, state: dict[str, Tensor]) -> None:
        """Restore what :meth:`state_tensors` gave (no-op for ``{}``); copies into this history's buffers."""
        if "H_in" not in state:
            return
        self.ensure(state["H_in"].size(1))
        self.H_in.copy_(state["H_in"])
        self.G_out.copy_(state["G_out"])
        self._scaled.clear()

    @property
    def nbytes(self) -> int:
        """Bytes of both buffers once allocated (``G_out`` counted while released too: it is allocated again at the
        next backward)."""
        if self._h_view is None:
            return 0
        size = self._h_view.element_size()
        return (self.num_nodes + 1) * self._h_view.size(1) * size * 2


class ChunkPushPull:
    """The chunk op of one aggregation op on one chunk, without autograd: the two halves of the pipeline's chunk op that
    :class:`ChunkAggregate` runs as its forward and backward, and that a model unit may call from its own
    fused ``autograd.Function`` (one autograd node per unit and chunk instead of one per elementary op).

    * :meth:`push`: ``H_in[R_c] ← x_c`` (``x_c = h ⊙ mask`` written straight into history, no separate copy),
      then ``Â[R_c, :] @ H_in``;
    * :meth:`pull`: ``G_out[R_c] ← scale · g`` (written straight into history), then ``Âᵀ[R_c, :] @ G_out``.

    Args:
        hist: the op's :class:`History`. a_c, at_c: rows ``R_c`` of ``Â`` and ``Âᵀ`` (CSR or
        :class:`~gnnpipe.tasks.nodes.graph.CompactRows`). start, end: ``R_c = [start, end)``.
        write: write history (``False`` when a chunk is recomputed in its backward).
    """

    __slots__ = ("hist", "a_c", "at_c", "start", "end", "write")

    def __init__(self, hist: History, a_c, at_c, start: int, end: int, write: bool = True):
        self.hist, self.a_c, self.at_c, self.start, self.end, self.write = hist, a_c, at_c, start, end, write

    def push(self, h: Tensor, mask: Tensor | None = None) -> Tensor:
        """``Â[R_c, :] @ H_in`` after ``H_in[R_c] ← h`` (``h ⊙ mask`` with a mask); ``[|R_c|, d]`` → ``[|R_c|, d]``.
        Rows of ``H_in`` known to be zero (:meth:`History.zero_inputs`) are read from the zero row. Call without
        autograd (inside an ``autograd.Function``). A recomputation (``write=False``) of a history that keeps its
        reads (:attr:`History.kept`) returns the forward's product (:meth:`History.recall`)."""
        return self.hist.recall(self.start, self.write, lambda: self._push(h, mask), copy=True)

    def _push(self, h: Tensor, mask: Tensor | None) -> Tensor:
        hist = self.hist
        if hist._h_view is None:
            hist.ensure(h.size(1))
        if self.write:
            if mask is None:
                hist.write_rows(hist._h_view, self.start, h)
            else:
                torch.mul(h, mask, out=hist.rows_of(hist._h_view, self.start, self.end))
            if hist._h_lazy:
                hist._inputs_written(self.start, self.end)
        src, redirect = hist.push_source()
        if redirect is not None and isinstance(self.a_c, CompactRows):  # columns renumbered once per state
            return self.a_c.mm(src, redirect=redirect, known=hist._h_key)
        return spmm(self.a_c, hist.H_in)

    def pull(self, g: Tensor, scale: float | None = None) -> Tensor:
        """``Âᵀ[R_c, :] @ G_out`` after ``G_out[R_c] ← g`` (``scale · g`` with a scale); ``[|R_c|, d]`` →
        ``[|R_c|, d]``. Rows of ``G_out`` known to be zero are read from the zero row (:meth:`History.pull_source`)."""
        hist = self.hist
        src, redirect = hist.pull_source(hist.write_grad_rows(self.start, g, scale))
        if redirect is not None and isinstance(self.at_c, CompactRows):  # columns renumbered once per state
            out = self.at_c.mm(src, redirect=redirect, known=hist._g_key)
        else:
            out = spmm(self.at_c, hist.G_out)
        if hist.scale_after_pull is not None:  # T2's doubling, while the rows just written are in the cache
            hist.scale_grad_rows(self.start, self.end, hist.scale_after_pull)
            hist._scaled.add(self.start)
        return out


class PushHistory(History):
    """The buffers of a halo-gradient (push) op (:class:`gnnpipe.tasks.nodes.aggregation.PushHistoryOp`).

    * ``H_in`` (``[N, d]``): the op's input rows, as :class:`History`;
    * ``G_in`` (``[N, d]``): gradients *pushed* into rows by the other chunks' backward: ``G_in[v]`` is
      ``Σ_c P_c[v]`` over the chunks ``c`` whose halo holds ``v``, ``P_c`` being the latest push of ``c``
      (this epoch's when ``c`` back-propagated already, else the last epoch's; zeros before any);
    * ``pushes``: ``{c: (halo rows LongTensor[h_c], P_c [h_c, d])}``, kept so that a new push of ``c``
      replaces its old one (``G_in[halo] += new − old``) instead of adding to it.

    T2 goes through :meth:`zero_grads` and :meth:`scale_grad_rows`, as for :class:`History`; checkpoints
    through :meth:`state_tensors` / :meth:`load_state_tensors`.

    Storage dtypes (``--history-dtype``): ``H_in`` is stored in ``dtype`` (e.g. bfloat16; its rows
    are overwritten, never accumulated, and up-cast when read). ``G_in`` and the stored pushes stay in
    ``grad_dtype`` (the compute dtype): ``G_in`` is a running sum that every push updates by ``new − old``, and
    in a narrow dtype each update's rounding error would stay in the sum for good (it drifts over epochs, as
    the old push is never subtracted exactly), whereas float32 keeps it exact to the compute precision.

    ``G_out`` is unused (``None``). Memory: ``N·d`` in ``dtype`` plus ``N·d + Σ_c |halo(c)|·d`` in ``grad_dtype``.

    Args:
        num_nodes, dtype, name, device: as :class:`History` (``dtype``: storage of ``H_in``).
        grad_dtype: dtype of ``G_in`` and of the pushes (default ``dtype``).
    """

    def __init__(self, num_nodes: int, dtype: torch.dtype = torch.float32, name: str = "",
                 device: torch.device | str = "cpu", grad_dtype: torch.dtype | None = None):
        super().__init__(num_nodes, dtype, name, device)
        self.grad_dtype = dtype if grad_dtype is None else grad_dtype
        self.G_in: Tensor | None = None
        self.pushes: dict[int, tuple[Tensor, Tensor]] = {}
        self.chunk_at: dict[int, int] = {}  # first row of a chunk → the chunk (T2's scale_grad_rows)

    def ensure(self, dim: int) -> None:
        if self.H_in is None:
            self.H_in = torch.zeros(self.num_nodes, dim, dtype=self.dtype, device=self.device)
            self.G_in = torch.zeros(self.num_nodes, dim, dtype=self.grad_dtype, device=self.device)

    @property
    def G_out(self) -> None:
        """Unused by the push op (``None``)."""
        return None

    @property
    def grads_released(self) -> bool:
        return False

    @property
    def nbytes(self) -> int:
        if self.H_in is None:
            return 0
        held = sum(p.numel() for _, p in self.pushes.values())
        return self.H_in.numel() * self.H_in.element_size() + (self.G_in.numel() + held) * self.G_in.element_size()

    def push(self, chunk: int, halo: Tensor, grad: Tensor, start: int | None = None) -> None:
        """Chunk ``chunk`` (first row ``start``) pushes ``grad`` (``[|halo|, d]``, the gradient of its halo rows
        ``halo``) into ``G_in``, replacing its previous push."""
        old = self.pushes.get(chunk)
        delta = grad if old is None else grad - old[1]
        self.G_in.index_add_(0, halo, delta)
        self.pushes[chunk] = (halo, grad.detach().clone())
        if start is not None:
            self.chunk_at[start] = chunk

    def zero_grads(self) -> None:
        """T2 at epoch end: ``G_in ← 0`` and every stored push forgotten."""
        if self.G_in is not None:
            self.G_in.zero_()
        self.pushes.clear()

    def scale_grad_rows(self, start: int, end: int, factor: float) -> None:
        """T2 after the backward of the chunk whose rows are ``[start, end)``: its (fresh) push counts ``factor``
        times (``G_in[halo] += (factor − 1)·P_c``). The chunk is the one that pushed with first row ``start``;
        no-op when it has not pushed (yet, or since :meth:`zero_grads`)."""
        chunk = self.chunk_at.get(start)
        if chunk in self.pushes:
            halo, p = self.pushes[chunk]
            self.G_in.index_add_(0, halo, p * (factor - 1.0))
            self.pushes[chunk] = (halo, p * factor)

    def state_tensors(self) -> dict[str, Tensor]:
        """``{"H_in", "G_in", "push{c}.halo", "push{c}.grad", "push{c}.start"}`` (see :meth:`History.state_tensors`)."""
        if self.H_in is None:
            return {}
        out = {"H_in": self.H_in, "G_in": self.G_in}
        starts = {c: s for s, c in self.chunk_at.items()}
        for c, (halo, p) in self.pushes.items():
            out[f"push{c}.halo"], out[f"push{c}.grad"] = halo, p
            out[f"push{c}.start"] = torch.tensor(starts.get(c, -1))
        return out

    def load_state_tensors(self, state: dict[str, Tensor]) -> None:
        if "H_in" not in state:
            return
        self.ensure(state["H_in"].size(1))
        self.H_in.copy_(state["H_in"])
        self.G_in.copy_(state["G_in"])
        self.pushes.clear()
        self.chunk_at.clear()
        for k in state:
            if k.startswith("push") and k.endswith(".halo"):
                c = int(k[len("push"): -len(".halo")])
                self.pushes[c] = (state[k].to(self.device, torch.long).clone(),
                                  state[f"push{c}.grad"].to(self.device, self.grad_dtype).clone())
                s = int(state[f"push{c}.start"])
                if s >= 0:
                    self.chunk_at[s] = c


class ChunkAggregate(torch.autograd.Function):
    """``out_c = Â[R_c, :] @ H_in`` after ``H_in[R_c] ← x_c``; backward is the pull ``Âᵀ[R_c, :] @ G_out``
    after ``G_out[R_c] ← g``. Both halves are :class:`ChunkPushPull`'.

    Args (to ``apply``):
        x_c: ``[|R_c|, d]`` input rows of chunk c (rows ``start:end`` of the relabelled graph).
        hist: the op's :class:`History`.
        a_c: ``[|R_c|, N]`` CSR rows of ``Â``. at_c: ``[|R_c|, N]`` CSR rows of ``Âᵀ``.
        start, end: ``R_c = [start, end)``.
        write: write ``x_c`` into ``H_in`` (``False`` when recomputing activations in the backward, so
            history is not changed twice).

    Returns:
        ``[|R_c|, d]``.
    """

    @staticmethod
    def forward(ctx, x_c: Tensor, hist: History, a_c: Tensor, at_c: Tensor, start: int, end: int,
                write: bool = True) -> Tensor:  # type: ignore[override]
        ctx.rows = ChunkPushPull(hist, a_c, at_c, start, end, write)
        return ctx.rows.push(x_c)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        return ctx.rows.pull(g), None, None, None, None, None, None
