"""Live bytes: what glibc's ``malloc`` has handed out and not taken back (``mallinfo2``: bytes in use in its arenas
plus its memory-mapped blocks), and :class:`LiveBytes`, their peak sampled after every ATen operation (a
``TorchDispatchMode``), so short-lived tensors count at their peak without the allocator's retention of freed
memory. Every task's memory model measures what a rank allocates with it; without glibc ≥ 2.33
(:func:`live_bytes` ``None``) the tasks fall back to formulas.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["LiveBytes", "live_bytes"]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _mallinfo2()


def live_bytes() -> int | None:
    """Bytes ``malloc`` has handed out and not taken back in this process (glibc ≥ 2.33 ``mallinfo2``: ``uordblks``
    + ``hblkhd``), or ``None`` without it."""
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return int(m.uordblks + m.hblkhd)


class LiveBytes(TorchDispatchMode):
    """The peak of :func:`live_bytes` inside the context, sampled after every ATen operation (inputs and outputs
    of the operation alive; its internal temporaries not seen).

    Attributes:
        base: live bytes when the context was entered. peak: the largest sample since then (or since :meth:`reset`).
    """

    def __enter__(self):
        self.base = self.peak = live_bytes() or 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        v = live_bytes() or 0
        if v > self.peak:
            self.peak = v
        return out

    def now(self) -> int:
        """Live bytes now (also a sample of the peak)."""
        v = live_bytes() or 0
        self.peak = max(self.peak, v)
        return v

    def reset(self) -> None:
        """Start a new peak from the live bytes now."""
        self.peak = live_bytes() or 0
