"""Real spherical harmonics, Wigner-D matrices, edge-aligned frames and the S² grid, in the conventions of e3nn
(Geiger & Smidt, arXiv 2207.09453) that eSCN (Passaro & Zitnick, ICML 2023, arXiv 2302.03655) and fairchem's
eSCN-MD use; computed here in float64 from their definitions (no tables).

Conventions
-----------

* **Coefficients.** A feature of degree ``l ≤ lmax`` has ``2l + 1`` real coefficients ``m = −l … l``; a
  node embedding stacks them degree-major (*l-major*): index ``l² + l + m``, ``(lmax + 1)²`` rows.
* **Real spherical harmonics** (orthonormal on the sphere, ``∫ Y_lm Y_l'm' dΩ = δ δ``), with ``y`` as the polar
  axis: for a unit vector ``(x, y, z)`` take ``θ`` the angle from ``+y`` and ``φ = atan2(x, z)``; then
  ``Y_l0 = N_l0 P_l(cos θ)``, ``Y_lm = √2 N_lm P_l^m(cos θ) cos(mφ)`` (``m > 0``),
  ``Y_l,−m = √2 N_lm P_l^m(cos θ) sin(mφ)``, ``N_lm = √((2l+1)/(4π) · (l−m)!/(l+m)!)``, ``P_l^m`` without the
  Condon–Shortley phase. Degree 1 is then ``√(3/4π) · (x, y, z)``: the three coefficients of ``l = 1`` are a
  Cartesian vector (a direct force head reads them as ``(F_x, F_y, F_z)``). Evaluated as polynomials in
  ``(x, y, z)`` (:func:`spherical_harmonics`), so they are smooth everywhere, poles included.
* **Wigner-D.** ``Y(R r) = D(R) Y(r)`` for a rotation matrix ``R``: ``D`` is block-diagonal with one orthogonal
  ``(2l+1) × (2l+1)`` block per degree, and ``D¹(R) = R``. :func:`wigner_d` evaluates the harmonics on a fixed set of
  points and their rotated images and solves for ``D`` (a least-squares fit that is exact: a polynomial in the
  entries of ``R``, twice differentiable for force training).
* **Edge frames.** eSCN rotates each edge ``j → i`` so that its vector points along ``+y``; the SO(2) convolution
  then mixes only coefficients of equal ``|m|``. :func:`edge_rotation` gives such a rotation (two charts: a
  Rodrigues rotation onto ``+y`` for ``y ≥ 0``, onto ``−y`` then by π about ``z`` otherwise). The frame is fixed up
  to a roll about the edge; eSCN's messages do not depend on it (the roll multiplies the ``±m`` pair of every
  degree by the same phase ``e^{imγ}``, which SO(2) convolutions and degree-wise gates commute with), so the
  outputs of a model using these frames are invariant to it up to rounding. ``roll`` composes a given roll.
* **m-major order.** Inside an edge frame eSCN keeps the coefficients with ``|m| ≤ mmax`` in *m-major* order:
  ``(l, 0)`` for ``l = 0 … lmax``, then for each ``m = 1 … mmax`` the ``(l, +m)`` for ``l = m … lmax`` followed
  by the ``(l, −m)`` (:func:`m_major_index`).
* **S² grid** (the grid feed-forward): ``res_beta`` polar angles ``β_b = (b + ½)π/res_beta`` (from ``+y``) times
  ``res_alpha`` azimuths ``α_a = 2πa/res_alpha``, the point ``(sin β sin α, cos β, sin β cos α)``; the projection
  back uses the Driscoll–Healy / Kostelec–Rockmore quadrature weights in ``β`` (:func:`s2_grid_matrices`).
"""

from __future__ import annotations

import math
from functools import cache

import torch
from torch import Tensor

__all__ = [
    "edge_rotation",
    "m_major_degrees",
    "m_major_index",
    "num_coefficients",
    "s2_grid_matrices",
    "spherical_harmonics",
    "wigner_d",
]


def num_coefficients(lmax: int) -> int:
    """``(lmax + 1)²``: the coefficients of degrees ``0 … lmax``."""
    return (lmax + 1) ** 2


def spherical_harmonics(lmax: int, unit: Tensor) -> Tensor:
    """The real orthonormal spherical harmonics of degrees ``0 … lmax`` (module docstring) of unit vectors.

    Args:
        lmax: the largest degree (≥ 0).
        unit: ``[..., 3]`` unit vectors (not normalised here: the harmonics are polynomials of degree ``l`` in them).

    Returns:
        ``[..., (lmax + 1)²]`` in ``unit``'s dtype, l-major.
    """
    x, y, z = unit.unbind(-1)
    a, b, c = z, x, y  # the standard z-polar harmonics at (z, x, y): the polar axis becomes y
    # Re / Im of (a + i b)^m: cos(mφ) sin^m θ and sin(mφ) sin^m θ
    re, im = [torch.ones_like(a)], [torch.zeros_like(a)]
    for _ in range(lmax):
        r, s = re[-1], im[-1]
        re.append(a * r - b * s)
        im.append(a * s + b * r)
    # P_l^m(c) / sin^m θ (no Condon–Shortley phase), by the three-term recurrence in l
    poly: dict[tuple[int, int], Tensor] = {}
    for m in range(lmax + 1):
        poly[m, m] = torch.full_like(c, float(math.prod(range(1, 2 * m, 2))))
        if m + 1 <= lmax:
            poly[m + 1, m] = (2 * m + 1) * c * poly[m, m]
        for l in range(m + 2, lmax + 1):
            poly[l, m] = ((2 * l - 1) * c * poly[l - 1, m] - (l + m - 1) * poly[l - 2, m]) / (l - m)
    out = []
    for l in range(lmax + 1):
        for m in range(-l, l + 1):
            k = abs(m)
            norm = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - k) / math.factorial(l + k))
            if m == 0:
                out.append(norm * poly[l, 0])
            else:
                out.append(math.sqrt(2.0) * norm * poly[l, k] * (re[k] if m > 0 else im[k]))
    return torch.stack(out, dim=-1)


@cache
def _wigner_fit(lmax: int) -> tuple[Tensor, list[Tensor]]:
    """``(points [K, 3], [pinv(Y_l(points)) [2l+1, K] for each l])`` in float64: a fixed point set on which every
    degree's harmonics have full column rank (a Fibonacci sphere of ``K = 2(2·lmax + 1)`` points)."""
    with torch.device("cpu"):
        K = 2 * (2 * lmax + 1)
        k = torch.arange(K, dtype=torch.float64) + 0.5
        y = 1 - 2 * k / K
        r = (1 - y * y).sqrt()
        phi = math.pi * (3 - math.sqrt(5)) * k
        pts = torch.stack([r * phi.sin(), y, r * phi.cos()], dim=-1)
        Y = spherical_harmonics(lmax, pts)
        pinvs = []
        for l in range(lmax + 1):
            block = Y[:, l * l:(l + 1) ** 2]
            s = torch.linalg.svdvals(block)
            if float(s[-1] / s[0]) < 1e-6:  # pragma: no cover - a property of the point set, checked once
                raise RuntimeError(f"the Wigner-D fit points are degenerate for degree {l}")
            pinvs.append(torch.linalg.pinv(block))
    return pts, pinvs


def wigner_d(rot: Tensor, lmax: int) -> Tensor:
    """The block-diagonal real Wigner-D matrices of rotations: ``Y(R r) = D(R) Y(r)`` for every unit ``r``.

    Args:
        rot: ``[E, 3, 3]`` rotation matrices (orthogonal, determinant +1), floating point.
        lmax: the largest degree.

    Returns:
        ``[E, (lmax+1)², (lmax+1)²]`` in ``rot``'s dtype (degree 1's block is ``rot`` itself).
    """
    pts, pinvs = _wigner_fit(lmax)
    pts = pts.to(rot.device, rot.dtype)
    E, L = rot.size(0), num_coefficients(lmax)
    Y = spherical_harmonics(lmax, torch.einsum("eij,kj->eki", rot, pts))  # [E, K, L]: Y(R p_k)
    D = rot.new_zeros(E, L, L)
    for l, pinv in enumerate(pinvs):
        s = slice(l * l, (l + 1) ** 2)
        # Y(R P) = Y(P) Dᵀ  ⇒  Dᵀ = pinv(Y(P)) Y(R P)
        D[:, s, s] = torch.einsum("ik,ekj->eji", pinv.to(rot.device, rot.dtype), Y[:, :, s])
    return D


def edge_rotation(vec: Tensor, roll: Tensor | None = None) -> Tensor:
    """Rotations taking each edge vector's direction to ``+y`` (module docstring, "Edge frames").

    Args:
        vec: ``[E, 3]`` non-zero edge vectors (any length), floating point; gradients flow back to them.
        roll: optional ``[E]`` angles (rad) of a further rotation about ``+y`` (the frame's free roll).

    Returns:
        ``[E, 3, 3]`` rotation matrices ``R`` with ``R · vec/|vec| = (0, 1, 0)``.
    """
    n = vec / vec.norm(dim=-1, keepdim=True)
    nx, ny, nz = n.unbind(-1)
    s = torch.where(ny.detach() >= 0, 1.0, -1.0).to(vec.dtype)  # the chart: onto s·ŷ
    # Rodrigues' rotation onto s·ŷ about v = n × sŷ = (−s·n_z, 0, s·n_x), cos = s·n_y ≥ 0
    vx, vz = -s * nz, s * nx
    c = s * ny
    zero = torch.zeros_like(nx)
    K = torch.stack([torch.stack([zero, -vz, zero], -1),
                     torch.stack([vz, zero, -vx], -1),
                     torch.stack([zero, vx, zero], -1)], dim=-2)
    eye = torch.eye(3, dtype=vec.dtype, device=vec.device).expand_as(K)
    R = eye + K + (K @ K) / (1 + c).view(-1, 1, 1)
    flip = torch.stack([s, s, torch.ones_like(s)], dim=-1)  # by π about z where the chart was −ŷ
    R = flip.unsqueeze(-1) * R
    if roll is not None:
        cos, sin = roll.cos(), roll.sin()
        one = torch.ones_like(cos)
        zr = torch.zeros_like(cos)
        Ry = torch.stack([torch.stack([cos, zr, sin], -1), torch.stack([zr, one, zr], -1),
                          torch.stack([-sin, zr, cos], -1)], dim=-2)
        R = Ry @ R
    return R


def m_major_index(lmax: int, mmax: int) -> list[int]:
    """The l-major indices ``l² + l + m`` of the coefficients with ``|m| ≤ mmax``, in m-major order (module
    docstring): ``(0,0) … (lmax,0)``, then per ``m = 1 … mmax`` the ``(l,+m)`` then the ``(l,−m)``, ``l = m … lmax``."""
    order = [l * l + l for l in range(lmax + 1)]
    for m in range(1, mmax + 1):
        order += [l * l + l + m for l in range(m, lmax + 1)]
        order += [l * l + l - m for l in range(m, lmax + 1)]
    return order


def m_major_degrees(lmax: int, mmax: int) -> list[int]:
    """The degree ``l`` of each coefficient of :func:`m_major_index`'s order."""
    return [math.isqrt(i) for i in m_major_index(lmax, mmax)]


def _quadrature_weights(res_beta: int) -> Tensor:
    """The quadrature weights in ``β`` of the ``2b = res_beta`` polar angles ``(j + ½)π/(2b)`` (Driscoll & Healy,
    *Computing Fourier transforms and convolutions on the 2-sphere*, 1994; the form of Kostelec & Rockmore's SO(3)
    FFTs), float64 ``[res_beta]``, divided by ``2(2b)²``:
    ``w_j = (2/b) sin(π(2j+1)/(4b)) Σ_{k<b} sin((2j+1)(2k+1)π/(4b)) / (2k+1)``."""
    b = res_beta // 2
    j = torch.arange(2 * b, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(b, dtype=torch.float64).unsqueeze(0)
    inner = (torch.sin((2 * j + 1) * (2 * k + 1) * math.pi / (4 * b)) / (2 * k + 1)).sum(1)
    w = (2.0 / b) * torch.sin(math.pi * (2 * j.squeeze(1) + 1) / (4 * b)) * inner
    return w / (2.0 * (2 * b) ** 2)


def s2_grid_matrices(lmax: int, res_beta: int, res_alpha: int) -> tuple[Tensor, Tensor]:
    """``(to_grid, from_grid)``, each float64 ``[res_beta, res_alpha, (lmax+1)²]``: a degree-``lmax`` signal's values
    on the S² grid (module docstring), ``f(β_b, α_a) = Σ_i x_i · to_grid[b, a, i]``, and its coefficients back from
    grid values by quadrature, ``x_i = Σ_ba f(β_b, α_a) · from_grid[b, a, i]`` (exact for band-limited signals:
    ``res_beta ≥ 2(lmax + 1)``, ``res_alpha ≥ 2·lmax + 1``).

    Raises:
        ValueError: an odd ``res_beta`` or a grid too coarse for ``lmax``.
    """
    if res_beta % 2 or res_beta < 2 * (lmax + 1) or res_alpha < 2 * lmax + 1:
        raise ValueError(f"an S² grid for lmax {lmax} needs an even res_beta >= {2 * (lmax + 1)} and res_alpha >= "
                         f"{2 * lmax + 1}; got {res_beta} x {res_alpha}")
    with torch.device("cpu"):
        beta = (torch.arange(res_beta, dtype=torch.float64) + 0.5) / res_beta * math.pi
        alpha = torch.arange(res_alpha, dtype=torch.float64) / res_alpha * 2 * math.pi
        sb, cb = beta.sin().view(-1, 1), beta.cos().view(-1, 1)
        pts = torch.stack([(sb * alpha.sin()), cb.expand(-1, res_alpha), (sb * alpha.cos())], dim=-1)
        to_grid = spherical_harmonics(lmax, pts)
        w = _quadrature_weights(res_beta) * res_beta ** 2 / res_alpha * (4 * math.pi)
        from_grid = to_grid * w.view(-1, 1, 1)
    return to_grid, from_grid
