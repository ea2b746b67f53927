r"""The 2D spherical Fourier–Bessel basis of DimeNet, evaluated numerically (no symbolic algebra).

DimeNet (Gasteiger, Groß, Günnemann, *Directional Message Passing for Molecular Graphs*, ICLR 2020, Sec. 4)
expands the distance ``d`` of an edge ``k → j`` and the angle ``α`` of a triplet ``k → j → i`` in the 2D
spherical Fourier–Bessel basis (``l < num_spherical`` degrees, ``n < num_radial`` roots, cutoff ``c``)::

    ã_ln(d, α) = u(d/c) · N_ln · j_l(z_ln · d/c) · Y_l^0(α)

* ``j_l`` is the spherical Bessel function of the first kind, ``j_l(x) = (−x)^l (x^{-1} d/dx)^l (sin x / x)``;
  ``z_ln`` its ``n``-th positive root; ``N_ln = 1/√(½ j_{l+1}(z_ln)²)`` normalises ``j_l(z_ln x)`` on
  ``[0, 1]`` (the paper's ``√(2/(c³ j_{l+1}²(z_ln)))`` up to the factor ``c^{-3/2}``, as in DimeNet's reference
  code and PyG's ``SphericalBasisLayer``);
* ``Y_l^0(α) = √((2l+1)/4π) · P_l(cos α)`` is the real spherical harmonic of order ``m = 0`` (``P_l`` the
  Legendre polynomial);
* ``u`` is DimeNet's polynomial envelope (PyG's ``Envelope``; applied by the caller).

The constants are those of DimeNet's reference code (and PyG's ``dimenet_utils``), which computes them in single
precision: the roots ``z_ln`` are the float32 roundings of the true roots (each found between two consecutive
roots of ``j_{l−1}``, which interlace with those of ``j_l``), and ``N_ln`` is evaluated in float32 arithmetic from
them (:func:`bessel_normalizers`). Keeping those values keeps the models' outputs unchanged.

Evaluation of ``j_l(x)`` (:func:`spherical_jn`, ``x ≥ 0``) in the input's dtype:

* for ``x ≥ l + 1`` the closed form ``j_l(x) = sin x · A_l(1/x) + cos x · B_l(1/x)``, whose polynomials follow
  from the recurrence ``j_{l+1} = (2l+1)/x · j_l − j_{l−1}`` (``A_0 = u``, ``B_0 = 0``, ``A_1 = u²``,
  ``B_1 = −u``; integer coefficients);
* for ``x < l + 1``, where the closed form cancels catastrophically (``j_l(x) ~ x^l / (2l+1)!!`` while its terms
  grow like ``(2l−1)!!/x^{l+1}``), the power series
  ``j_l(x) = x^l Σ_k (−x²/2)^k / (k! (2l+2k+1)!!)``, summed to the dtype's precision.

Derivatives (any order, so a conservative-force loss can take a backward of a backward) come from
``(2l+1) j_l' = l j_{l−1} − (l+1) j_{l+1}``, which involves no division by ``x`` and so stays accurate at small
distances; autograd keeps only the argument per function (one value per basis function and edge).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import cache

import numpy as np
import torch
from torch import Tensor

__all__ = ["bessel_normalizers", "spherical_bessel_zeros", "spherical_harmonics_y0", "spherical_jn"]

#: the dtype tables are built in and the values evaluated in, per input dtype (half precisions are up-cast)
_COMPUTE_DTYPE = {torch.float64: torch.float64, torch.float32: torch.float32}


# ---------------------------------------------------------------------------------------------------- constants
def _jn_float64(l: int, x: np.ndarray) -> np.ndarray:
    """``j_l(x)`` in float64 by upward recurrence from ``j_0``, ``j_1`` (accurate for ``x > l``, where the roots
    and the normalisers need it)."""
    x = np.asarray(x, dtype=np.float64)
    j0 = np.sin(x) / x
    if l == 0:
        return j0
    j1 = (j0 - np.cos(x)) / x
    for k in range(1, l):
        j0, j1 = j1, (2 * k + 1) / x * j1 - j0
    return j1


def _bisect(l: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The roots of ``j_l`` in the brackets ``(lo, hi)`` (one sign change each), by bisection to the last bit."""
    lo, hi = lo.astype(np.float64).copy(), hi.astype(np.float64).copy()
    f_lo = _jn_float64(l, lo)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not np.any((mid != lo) & (mid != hi)):
            break
        f_mid = _jn_float64(l, mid)
        left = np.sign(f_mid) == np.sign(f_lo)
        lo, f_lo = np.where(left, mid, lo), np.where(left, f_mid, f_lo)
        hi = np.where(left, hi, mid)
    return 0.5 * (lo + hi)


@cache
def _zeros_cached(num_spherical: int, num_radial: int) -> np.ndarray:
    S, R = num_spherical, num_radial
    zeros = np.zeros((S, R), dtype=np.float32)
    zeros[0] = np.arange(1, R + 1) * np.pi
    points = np.arange(1, R + S) * np.pi  # roots of j_0, brackets of those of j_1
    for l in range(1, S):
        roots = _bisect(l, points[:-1], points[1:]).astype(np.float32)  # R + S − 1 − l roots
        zeros[l] = roots[:R]
        points = roots.astype(np.float64)
    zeros.setflags(write=False)
    return zeros


def spherical_bessel_zeros(num_spherical: int, num_radial: int) -> np.ndarray:
    """``[S, R]`` float32 array: ``[l, n]`` the ``(n+1)``-th positive root of ``j_l`` rounded to float32 (DimeNet's
    ``Jn_zeros``: the roots of ``j_l`` are searched between consecutive roots of ``j_{l−1}``, starting from
    ``j_0``'s ``kπ``). Read-only, cached per size.

    Raises:
        ValueError: a size below 1.
    """
    S, R = int(num_spherical), int(num_radial)
    if S < 1 or R < 1:
        raise ValueError(f"num_spherical and num_radial must be >= 1, got {num_spherical}, {num_radial}")
    return _zeros_cached(S, R)


def bessel_normalizers(zeros: np.ndarray) -> np.ndarray:
    """``[S, R]`` float32 array of ``N_ln = 1/√(½ j_{l+1}(z_ln)²)`` for the float32 roots ``zeros`` ``[S, R]``
    (:func:`spherical_bessel_zeros`), computed in float32 arithmetic step by step as DimeNet's reference code does
    (``j_{l+1}(z) = √(π/(2z)) · J_{l+3/2}(z)`` with ``π/(2z)``, the square root and the product in float32 and
    ``J_{l+3/2}(z)`` rounded to float32 from float64), so the values equal PyG's ``bessel_basis`` normalisers."""
    z32 = np.asarray(zeros, dtype=np.float32)
    z64 = z32.astype(np.float64)
    bessel_j = np.empty_like(z64)
    for l in range(z32.shape[0]):  # J_{l+3/2}(z) = √(2z/π) · j_{l+1}(z), in float64
        bessel_j[l] = np.sqrt(2.0 * z64[l] / np.pi) * _jn_float64(l + 1, z64[l])
    pre = np.sqrt(np.float32(np.pi) / (np.float32(2) * z32))
    jn = pre * bessel_j.astype(np.float32)
    return np.float32(1) / np.sqrt(np.float32(0.5) * (jn * jn))


# ---------------------------------------------------------------------------------------------------- j_l tables
@cache
def _closed_form(l: int, m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Integer coefficients (ascending powers of ``u = 1/x``) of ``A``, ``B`` with
    ``d^m j_l / dx^m = sin x · A(u) + cos x · B(u)``: ``j_0 = sin x · u``, ``j_1 = sin x · u² − cos x · u``, the
    recurrence ``j_{k+1} = (2k+1) u j_k − j_{k−1}``, and ``d/dx (sin x · A + cos x · B) = sin x · (−u² A' − B) +
    cos x · (A − u² B')`` (``du/dx = −u²``)."""
    if m > 0:
        A, B = _closed_form(l, m - 1)

        def du(p: tuple[int, ...]) -> list[int]:  # −u² p'(u), ascending
            return [0, 0] + [-k * p[k] for k in range(1, len(p))]

        def add(*ps) -> tuple[int, ...]:
            out = [0] * max(len(q) for q in ps)
            for q in ps:
                for i, c in enumerate(q):
                    out[i] += c
            return tuple(out)

        return add(du(A), [-c for c in B]), add(A, du(B))
    if l == 0:
        return (0, 1), (0,)
    if l == 1:
        return (0, 0, 1), (0, -1)
    (a1, b1), (a0, b0) = _closed_form(l - 1, 0), _closed_form(l - 2, 0)
    k = 2 * l - 1  # (2l−1)·u·p(u) − q(u)
    A = [c - (a0[i] if i < len(a0) else 0) for i, c in enumerate([0] + [k * c for c in a1])]
    B = [c - (b0[i] if i < len(b0) else 0) for i, c in enumerate([0] + [k * c for c in b1])]
    return tuple(A), tuple(B)


def _switch(l: int, m: int) -> float:
    """The argument below which the ``m``-th derivative of ``j_l`` is summed as a power series."""
    return float(l + 1 + m)


@cache
def _series(l: int, m: int, tol: float) -> tuple[int, tuple[Fraction, ...]]:
    """``(e, (d_0, d_1, …))`` with ``d^m j_l / dx^m = x^e Σ_i d_i x^{2i}`` (``e ≥ 0``), from
    ``j_l(x) = x^l Σ_k c_k x^{2k}``, ``c_k = (−1/2)^k / (k! (2l+2k+1)!!)``: enough terms that the first left out
    is below ``tol`` times the largest term at the switch point (the rounding level of the sum there)."""
    t2 = Fraction(int(_switch(l, m))) ** 2
    c = Fraction(1)
    for k in range(1, 2 * l + 2, 2):
        c /= k
    terms: list[Fraction] = []
    e = None
    largest = previous = Fraction(0)
    k = 0
    while True:
        power, coef = l + 2 * k, c
        for _ in range(m):  # the m-th derivative of coef · x^power
            coef, power = coef * power, power - 1
        if power >= 0 and coef != 0:
            if e is None:
                e = power
            size = abs(coef) * t2 ** ((power - e) // 2)
            if terms and size < tol * largest and size < previous:
                return e, tuple(terms)
            terms.append(coef)
            largest, previous = max(largest, size), size
        k += 1
        c = c * Fraction(-1, 2 * k * (2 * l + 2 * k + 1))


@cache
def _tables(orders: tuple[int, ...], m: int, dtype: torch.dtype) -> dict[str, Tensor]:
    """CPU tables of the ``m``-th derivatives of the columns' orders ``orders`` for ``dtype``: the series
    coefficients ``[K, C]`` in ``x²`` and the closed-form coefficients ``A``, ``B`` ``[D, C]`` in ``1/x`` (highest
    power first, zero-padded), the series' leading powers ``e`` and the switch points ``[C]``."""
    tol = float(torch.finfo(dtype).eps) / 16
    series = [_series(l, m, tol) for l in orders]
    closed = [_closed_form(l, m) for l in orders]

    def table(rows: list) -> Tensor:
        size = max(len(r) for r in rows)
        cols = [[float(r[i]) if i < len(r) else 0.0 for i in range(size)][::-1] for r in rows]
        return torch.tensor(cols, dtype=torch.float64).T.contiguous().to(dtype)

    return {"series": table([t for _, t in series]), "A": table([a for a, _ in closed]),
            "B": table([b for _, b in closed]), "power": torch.tensor([float(e) for e, _ in series], dtype=dtype),
            "switch": torch.tensor([_switch(l, m) for l in orders], dtype=dtype)}


_DEVICE_TABLES: dict[tuple, dict[str, Tensor]] = {}


def _device_tables(orders: tuple[int, ...], m: int, x: Tensor) -> dict[str, Tensor]:
    key = (orders, m, x.dtype, x.device)
    tab = _DEVICE_TABLES.get(key)
    if tab is None:
        if len(_DEVICE_TABLES) >= 512:
            _DEVICE_TABLES.clear()
        tab = _DEVICE_TABLES[key] = {k: v.to(x.device) for k, v in _tables(orders, m, x.dtype).items()}
    return tab


def _horner(coefficients: Tensor, y: Tensor) -> Tensor:
    """``Σ_i coefficients[i] y^{D−1−i}`` per column (``coefficients`` ``[D, C]``, highest power first)."""
    if coefficients.size(0) == 1:
        return coefficients[0].expand_as(y)
    acc = torch.addcmul(coefficients[1], coefficients[0], y)
    for i in range(2, coefficients.size(0)):
        acc = torch.addcmul(coefficients[i], acc, y)
    return acc


def _values(x: Tensor, orders: tuple[int, ...], m: int) -> Tensor:
    """``d^m/dx^m j_{orders[c]}(x[..., c])`` (no autograd), in ``x``'s dtype."""
    tab = _device_tables(orders, m, x)
    small = _horner(tab["series"], x * x) * x.pow(tab["power"])
    u = x.reciprocal()
    large = torch.sin(x) * _horner(tab["A"], u) + torch.cos(x) * _horner(tab["B"], u)
    return torch.where(x < tab["switch"], small, large)


class _SphericalBessel(torch.autograd.Function):
    """``d^m j_l(x)`` per column with the ``(m+1)``-th derivative as its backward (differentiable to any order)."""

    @staticmethod
    def forward(ctx, x: Tensor, orders: tuple[int, ...], m: int) -> Tensor:
        ctx.save_for_backward(x)
        ctx.orders, ctx.m = orders, m
        return _values(x, orders, m)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        return grad * _SphericalBessel.apply(x, ctx.orders, ctx.m + 1), None, None


def spherical_jn(orders: int | Sequence[int], x: Tensor, derivative: int = 0) -> Tensor:
    """The spherical Bessel functions ``j_l(x)`` (or their ``derivative``-th derivative), differentiable to any
    order (see the module docstring for the method; accurate to a few units of the dtype's precision relative to
    ``max(|j_l(x)|, |j_l| near x)`` for ``x ≥ 0``).

    Args:
        orders: one order ``l ≥ 0`` for every element, or one per column (the last dimension of ``x``).
        x: ``[..., C]`` arguments (``≥ 0``; dimensionless), float32 or float64 (half precisions are evaluated in
            float32 and returned in their dtype).
        derivative: ``m ≥ 0``.

    Returns:
        ``x``'s shape and dtype.

    Raises:
        ValueError: a negative order or derivative, or as many orders as columns not given.
        TypeError: ``x`` is not floating point.
    """
    if not x.is_floating_point():
        raise TypeError(f"spherical_jn needs a floating-point tensor, got {x.dtype}")
    if int(derivative) < 0:
        raise ValueError(f"derivative must be >= 0, got {derivative}")
    single = isinstance(orders, int)
    cols = (int(orders),) if single else tuple(int(l) for l in orders)
    if any(l < 0 for l in cols):
        raise ValueError(f"orders must be >= 0, got {cols}")
    if not single and (x.dim() == 0 or x.size(-1) != len(cols)):
        raise ValueError(f"{len(cols)} orders for an input of shape {list(x.shape)}: give one per column")
    compute = _COMPUTE_DTYPE.get(x.dtype, torch.float32)
    y = x.to(compute).unsqueeze(-1) if single else x.to(compute)
    out = _SphericalBessel.apply(y, cols, int(derivative))
    return (out.squeeze(-1) if single else out).to(x.dtype)


# ---------------------------------------------------------------------------------------------------- Y_l^0
def spherical_harmonics_y0(angle: Tensor, num_spherical: int) -> Tensor:
    """``[T]`` angles (radians) → ``[T, L]``: ``Y_l^0(α) = √((2l+1)/4π) · P_l(cos α)``, ``l < L =
    num_spherical``, by the Legendre recurrence ``(l+1) P_{l+1} = (2l+1) c P_l − l P_{l−1}`` (stable on
    ``[−1, 1]``; twice differentiable through autograd), in ``angle``'s dtype.

    Raises:
        ValueError: ``num_spherical < 1``.
    """
    L = int(num_spherical)
    if L < 1:
        raise ValueError(f"num_spherical must be >= 1, got {num_spherical}")
    out = [torch.full_like(angle, 0.5 / math.sqrt(math.pi))]
    if L > 1:
        c = torch.cos(angle)
        p_prev, p = 1.0, c  # P_0, P_1
        for l in range(1, L):
            if l > 1:
                p_prev, p = p, ((2 * l - 1) * c * p - (l - 1) * p_prev) / l
            out.append(math.sqrt((2 * l + 1) / (4 * math.pi)) * p)
    return torch.stack(out, dim=-1)
