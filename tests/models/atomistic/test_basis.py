"""The numerical spherical Fourier–Bessel basis of DimeNet++ (``gnnpipe/models/atomistic/basis.py``): PyG's
constants, PyG's ``SphericalBasisLayer`` values and first and second derivatives (float64) where PyG's sympy forms
are themselves accurate, the exact values (mpmath) down to tiny distances, and the time to build the models."""

from __future__ import annotations

import functools
import pickle
import time

import numpy as np
import pytest
import torch

from gnnpipe.models.atomistic.basis import (
    bessel_normalizers,
    spherical_bessel_zeros,
    spherical_harmonics_y0,
    spherical_jn,
)
from gnnpipe.models.atomistic.dimenet import CachedSphericalBasis, SphericalBasis

F64 = torch.float64


@functools.cache
def pyg_layer(S: int, R: int, cutoff: float, envelope: int):
    """PyG's own layer (sympy-derived functions: seconds to build, so once per size)."""
    from torch_geometric.nn.models.dimenet import SphericalBasisLayer

    return SphericalBasisLayer(S, R, cutoff, envelope)


def pyg_normalizers(zeros: np.ndarray) -> np.ndarray:
    """PyG's ``bessel_basis`` normalisers of its float32 roots (``dimenet_utils``), as it computes them."""
    from torch_geometric.nn.models.dimenet_utils import Jn

    rows = []
    for order in range(zeros.shape[0]):
        tmp = [0.5 * Jn(zeros[order, i], order + 1) ** 2 for i in range(zeros.shape[1])]
        rows.append(1 / np.array(tmp) ** 0.5)
    return np.array(rows)


def inputs(S: int, R: int, cutoff: float, lo: float, seed: int = 0, E: int = 300, T: int = 900):
    """Distances on ``[lo·c, 1.05·c]`` (past the cutoff too), angles on ``[0, π]`` (both ends included), triplet
    edge ids, and random weights for the derivative checks; float64."""
    g = torch.Generator().manual_seed(seed)
    dist = torch.linspace(lo, 1.05, E, dtype=F64) * cutoff
    angle = torch.cat([torch.tensor([0.0, torch.pi], dtype=F64), torch.rand(T - 2, generator=g, dtype=F64) * torch.pi])
    idx = torch.randint(0, E, (T,), generator=g)
    W = torch.randn(T, S * R, generator=g, dtype=F64)
    v, w = torch.randn(E, generator=g, dtype=F64), torch.randn(T, generator=g, dtype=F64)
    return dist, angle, idx, W, v, w


def values_and_derivatives(basis, dist, angle, idx, W, v, w) -> list[torch.Tensor]:
    """``sbf``, the gradients of ``Σ W·sbf`` with respect to distances and angles, and the gradients of a random
    projection of those (second derivatives, as a force loss takes them)."""
    dist, angle = dist.clone().requires_grad_(True), angle.clone().requires_grad_(True)
    out = basis(dist, angle, idx)
    gd, ga = torch.autograd.grad((out * W).sum(), (dist, angle), create_graph=True)
    hd, ha = torch.autograd.grad((gd * v).sum() + (ga * w).sum(), (dist, angle))
    return [t.detach() for t in (out, gd, ga, hd, ha)]


def assert_close_to_scale(ours: torch.Tensor, theirs: torch.Tensor, rtol: float, what: str) -> None:
    err = float((ours - theirs).abs().max() / theirs.abs().max())
    assert err <= rtol, f"{what}: max |ours − theirs| / max |theirs| = {err:.2e} > {rtol:.0e}"


# ---------------------------------------------------------------------------------------------- constants
@pytest.mark.parametrize("R", [1, 6, 64])
def test_roots_and_normalizers_equal_pygs_bit_for_bit(R):
    from torch_geometric.nn.models.dimenet_utils import Jn_zeros

    for S in range(1, 13):
        zeros = spherical_bessel_zeros(S, R)
        theirs = Jn_zeros(S, R)
        assert zeros.dtype == np.float32 and zeros.shape == (S, R)
        np.testing.assert_array_equal(zeros, theirs)
        np.testing.assert_array_equal(bessel_normalizers(zeros), pyg_normalizers(theirs))


def test_constants_reject_empty_sizes():
    with pytest.raises(ValueError, match=">= 1"):
        spherical_bessel_zeros(0, 3)
    with pytest.raises(ValueError, match=">= 1"):
        spherical_bessel_zeros(2, 0)


# ---------------------------------------------------------------------------------------------- against PyG
CONFIGS = [(2, 3, 5.0, 5), (3, 4, 3.0, 6), (5, 2, 6.0, 4),
           pytest.param(7, 6, 6.0, 5, marks=pytest.mark.slow)]  # PyG's sympy forms of 7 × 6 take ~10 s to build


@pytest.mark.parametrize("S,R,cutoff,envelope", CONFIGS)
def test_values_equal_pygs_layer(S, R, cutoff, envelope):
    """Within 1e-12 of the largest value wherever PyG's sympy forms do not cancel (``d ≥ 0.2·c``; below, their
    error grows like ``(2l−1)!!/x^{l+1}``, see :func:`test_tiny_distances_are_exact`); both of our layers."""
    theirs = pyg_layer(S, R, cutoff, envelope)
    dist, angle, idx, *_ = inputs(S, R, cutoff, 0.2)
    ref = theirs(dist, angle, idx)
    for layer in (SphericalBasis(S, R, cutoff, envelope), CachedSphericalBasis(S, R, cutoff, envelope)):
        out = layer(dist, angle, idx)
        assert out.shape == (idx.numel(), S * R) and out.dtype == F64
        assert_close_to_scale(out, ref, 1e-12, f"{type(layer).__name__} values")
    # the angular and radial functions one by one, as PyG's forward calls them (each to its own size, before the
    # envelope: from d = 0.25·c, where the cancellation in PyG's j_6 forms stays below 1e-12)
    ours = CachedSphericalBasis(S, R, cutoff, envelope)
    x = torch.linspace(0.25, 1.05, 300, dtype=F64)
    for f, g in zip(ours.bessel_funcs, theirs.bessel_funcs):
        assert_close_to_scale(f(x), g(x), 1e-12, "bessel_funcs")
    for f, g in zip(ours.sph_funcs, theirs.sph_funcs):
        assert_close_to_scale(f(angle), g(angle), 1e-13, "sph_funcs")


@pytest.mark.parametrize("S,R,cutoff,envelope", CONFIGS)
def test_first_and_second_derivatives_equal_pygs(S, R, cutoff, envelope):
    theirs = pyg_layer(S, R, cutoff, envelope)
    args = inputs(S, R, cutoff, 0.2, seed=1)
    ref = values_and_derivatives(theirs, *args)
    ours = values_and_derivatives(SphericalBasis(S, R, cutoff, envelope), *args)
    for name, a, b in zip(("values", "d/dd", "d/dα", "d²/dd²", "d²/dα²"), ours, ref):
        assert_close_to_scale(a, b, 1e-12, name)


def test_derivatives_pass_gradcheck_and_gradgradcheck():
    basis = SphericalBasis(4, 3, 5.0)
    dist = torch.tensor([0.3, 1.1, 2.4, 3.7, 4.9], dtype=F64, requires_grad=True)
    angle = torch.tensor([0.2, 1.3, 2.0, 3.0], dtype=F64, requires_grad=True)
    idx = torch.tensor([0, 2, 3, 4])
    def fn(d, a):
        return basis(d, a, idx)

    assert torch.autograd.gradcheck(fn, (dist, angle))
    assert torch.autograd.gradgradcheck(fn, (dist, angle))


# ---------------------------------------------------------------------------------------------- exact values
def test_tiny_distances_are_exact():
    """Down to ``d = 1e-6·c`` the radial functions equal the exact ``N_ln j_l(z_ln x)`` (mpmath, 30 digits, the
    same float32 constants): to 1e-13 of each value for ``d ≤ 0.1·c``, where PyG's closed forms lose every digit
    (``j_6`` at ``x = 1e-5``: ``~1e-36`` from terms of ``~1e39``), and to 1e-14 of each function's size above."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    S, R = 7, 6
    basis = SphericalBasis(S, R, 6.0)
    x = torch.cat([torch.logspace(-6, -1, 11, dtype=F64), torch.linspace(0.12, 1.0, 12, dtype=F64)])
    ours = basis.radial(x)
    zeros = spherical_bessel_zeros(S, R)
    norm = bessel_normalizers(zeros)
    exact = torch.empty_like(ours)
    for e, xe in enumerate(x.tolist()):
        for l in range(S):
            for n in range(R):
                a = mpmath.mpf(float(zeros[l, n])) * mpmath.mpf(xe)
                j = mpmath.sqrt(mpmath.pi / (2 * a)) * mpmath.besselj(l + mpmath.mpf(1) / 2, a)
                exact[e, l * R + n] = float(mpmath.mpf(float(norm[l, n])) * j)
    tiny = x <= 0.1  # no roots there (z_ln · 0.1 < z_l0): relative to each value
    err = ((ours - exact).abs() / exact.abs())[tiny].max()
    assert err < 1e-13, float(err)
    err = ((ours - exact).abs() / exact.abs().max(dim=0).values)[~tiny].max()  # roots inside: to each function's size
    assert err < 1e-14, float(err)
    assert torch.isfinite(basis(x * 6.0, torch.zeros(3, dtype=F64), torch.arange(3))).all()


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
def test_spherical_jn_and_its_derivatives_are_exact(dtype, rtol):
    """``j_l`` and its first two derivatives against mpmath on ``[1e-6, 200]`` (tiny arguments, both sides of the
    switch from the series to the closed form at ``l + 1 + m``, and large ones), relative to the value or, near a
    root, to the function's size nearby."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    xs = [1e-6, 1e-3, 0.05, 0.5, 1.0, 1.999, 2.001, 3.5, 5.0, 6.999, 7.001, 9.5, 12.0, 40.0, 200.0]
    tiny = torch.finfo(dtype).tiny * 1e6
    for l in (0, 1, 2, 4, 6, 8):
        def j(t, l=l):
            return mpmath.sqrt(mpmath.pi / (2 * t)) * mpmath.besselj(l + mpmath.mpf(1) / 2, t)

        for m in range(3):
            ours = spherical_jn(l, torch.tensor(xs, dtype=dtype), m)
            assert ours.dtype == dtype
            for xi, oi in zip(xs, ours.tolist()):
                ref = float(mpmath.diff(j, mpmath.mpf(xi), m))
                size = max(abs(float(mpmath.diff(j, mpmath.mpf(xi) * f, m))) for f in (0.9, 1.1))
                scale = max(abs(ref), 1e-3 * size, tiny)
                assert abs(oi - ref) <= rtol * scale, (l, m, xi, oi, ref)


def test_spherical_jn_columns_and_errors():
    x = torch.rand(5, 3, dtype=F64) * 10
    cols = spherical_jn([0, 3, 5], x)
    for c, l in enumerate([0, 3, 5]):
        torch.testing.assert_close(cols[:, c], spherical_jn(l, x[:, c]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="one per column"):
        spherical_jn([0, 1], x)
    with pytest.raises(ValueError, match=">= 0"):
        spherical_jn(-1, x)
    with pytest.raises(ValueError, match=">= 0"):
        spherical_jn(1, x, derivative=-1)
    with pytest.raises(TypeError, match="floating"):
        spherical_jn(1, torch.arange(3))
    assert spherical_jn(2, x.half()).dtype == torch.float16


def test_spherical_harmonics_are_legendre_polynomials():
    angle = torch.linspace(0, torch.pi, 50, dtype=F64)
    y = spherical_harmonics_y0(angle, 5)
    c = angle.cos()
    p = [torch.ones_like(c), c, (3 * c**2 - 1) / 2, (5 * c**3 - 3 * c) / 2, (35 * c**4 - 30 * c**2 + 3) / 8]
    for l in range(5):
        torch.testing.assert_close(y[:, l], ((2 * l + 1) / (4 * torch.pi)) ** 0.5 * p[l], rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError):
        spherical_harmonics_y0(angle, 0)


def test_float32_basis_follows_float64():
    S, R, c = 7, 6, 6.0
    dist, angle, idx, *_ = inputs(S, R, c, 0.1)
    basis = SphericalBasis(S, R, c)
    ref = basis(dist, angle, idx)
    out = basis(dist.float(), angle.float(), idx)
    assert out.dtype == torch.float32
    assert_close_to_scale(out.double(), ref, 1e-6, "float32")


def test_the_layer_pickles_and_the_model_gives_the_same_energies(batch):
    from gnnpipe.models import build_model

    from .conftest import DIMENET_SMALL, make_graph

    layer = pickle.loads(pickle.dumps(CachedSphericalBasis(3, 4, 3.0)))
    assert len(layer.bessel_funcs) == 12 and len(layer.sph_funcs) == 3
    torch.manual_seed(0)
    model = build_model("dimenet++", 0, 1, **DIMENET_SMALL).double()
    copy = pickle.loads(pickle.dumps(model))
    graph = make_graph(batch, DIMENET_SMALL["cutoff"])
    torch.testing.assert_close(copy(batch, graph)["energy"], model(batch, graph)["energy"], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- build time
def test_building_the_atomistic_models_is_fast():
    """Default-size models build in well under a second of CPU (DimeNet++ took 15–30 s: sympy; GemNet-T's ~110
    QR factorisations of its He-orthogonal initialisation took seconds more on several threads of a busy
    machine). Process CPU time (all threads), after a small build of each has done the first imports, so a loaded
    machine's waiting does not count."""
    from gnnpipe.models import build_model

    from .conftest import SMALL

    for name, small in SMALL.items():
        build_model(name, 0, 1, **small)
    t0, c0 = time.perf_counter(), time.process_time()
    SphericalBasis(8, 7, 5.0)(torch.rand(10) * 5, torch.rand(20), torch.randint(0, 10, (20,)))
    basis_cpu = time.process_time() - c0
    assert basis_cpu < 0.25, f"building and running the spherical basis took {basis_cpu:.2f} s of CPU"
    bounds = {"schnet": 1.0, "dimenet++": 1.0, "gemnet-t": 4.0}  # gemnet-t: ~1.2 s, QR-bound
    for name, bound in bounds.items():
        t0, c0 = time.perf_counter(), time.process_time()
        build_model(name, 0, 1)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        assert cpu < bound, f"building {name} took {cpu:.2f} s of CPU ({wall:.2f} s wall)"


def test_loading_a_model_file_skips_the_initialisation_it_overwrites(tmp_path):
    """``models.load`` (predict, relax, evaluate, the calculator, every rank restoring a checkpoint) builds the
    model without drawing its random weights: GemNet-T's default size opens in a fraction of its build (the QR
    factorisations are its cost), with the saved weights exactly."""
    from gnnpipe.models import build_model, load, save

    torch.manual_seed(0)
    model = build_model("gemnet-t", 0, 1)
    save(model, tmp_path / "g.pt")
    c0 = time.process_time()
    loaded = load(tmp_path / "g.pt")
    cpu = time.process_time() - c0
    assert cpu < 0.6, f"loading gemnet-t took {cpu:.2f} s of CPU"
    for (k, v), w in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(v, w), k
    torch.manual_seed(0)
    fresh = build_model("gemnet-t", 0, 1, init=False)  # no weights drawn: not those of the seeded build
    assert any(not torch.equal(v, w) for v, w in zip(model.state_dict().values(), fresh.state_dict().values()))

