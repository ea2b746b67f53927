"""The atomistic cost model (gnnpipe.tasks.s2ef.cost): bytes per interaction block equal the measured "gp"
counters exactly (schnet, dimenet++, gemnet-t and escn-md, G ∈ {2, 3}, both edge-gather modes, conservative forces in
the loss), the memory and time models' arithmetic, and the layout ranking."""

from __future__ import annotations

import re

import pytest
import torch

from gnnpipe import schedulers
from gnnpipe.core.run.launch import spawn

MODELS = {
    "schnet": {"num_filters": 6, "num_gaussians": 6},
    "dimenet++": {"int_emb_size": 4, "basis_emb_size": 3, "out_emb_channels": 6, "num_spherical": 3, "num_radial": 3},
    "gemnet-t": {"emb_size_trip": 4, "emb_size_rbf": 3, "emb_size_cbf": 3, "emb_size_bil_trip": 5, "num_spherical": 3,
                 "num_radial": 4, "num_atom": 1},
    "escn-md": {"lmax": 2, "mmax": 1, "hidden_channels": 6, "edge_channels": 4, "num_distance_basis": 6},
}
#: (model, partitioner, mode): both modes and both partitioners for each model
CASES = [("schnet", "edge-chunk", "allgather"), ("schnet", "atom-owner", "halo"),
         ("dimenet++", "edge-chunk", "halo"), ("dimenet++", "atom-owner", "allgather"),
         ("dimenet++", "edge-chunk", "allgather"), ("gemnet-t", "edge-chunk", "halo"),
         ("escn-md", "atom-owner", "allgather"), ("escn-md", "edge-chunk", "allgather")]


def _batch():
    from torch_geometric.data import Batch

    from tests.tasks.s2ef.toy import emt_clusters

    return Batch.from_data_list(emt_clusters(3, seed=5))


def _model(name: str, direct: bool = False):
    from gnnpipe.models import build_model

    torch.manual_seed(0)
    return build_model(name, 0, 1, num_layers=2, hidden=8, cutoff=3.0, max_neighbors=8, direct_forces=direct,
                       **MODELS[name]).double().train()


def _measure(rank: int, world: int, cases: list) -> list:
    """Bytes this rank's counter saw in one training step of each case (energy + conservative forces in the loss,
    its backward), and the formula's prediction."""
    from gnnpipe.core.comm import Comm
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.partitioners import plan_graph_parallel
    from gnnpipe.tasks.s2ef.cost import step_bytes
    from gnnpipe.tasks.s2ef.graph_parallel import GraphParallelComm
    from gnnpipe.tasks.s2ef.layout import replicate_owned

    batch = _batch()
    graphs = {rev: build_graph(batch, 3.0, 8, with_reverse=rev) for rev in (False, True)}
    out = []
    for name, method, mode, direct in cases:
        model = _model(name, direct)
        graph = graphs[bool(getattr(model, "uses_reverse_edges", False))]
        plan = plan_graph_parallel(graph, world, method, pos=batch.pos)
        counter = Comm("cpu")
        comm = GraphParallelComm(plan, mode=mode, comm=counter)
        pred = model(batch, comm.local_graph(graph), comm, forces=True)
        forces = replicate_owned(pred["forces"], comm) if direct else pred["forces"]  # as the trainer does
        loss = (pred["energy"] ** 2).sum() + (forces ** 2).sum()
        loss.backward()
        formula = step_bytes(model, plan, num_structures=batch.num_graphs, mode=mode, element_size=8)[rank]
        out.append((counter.counters()["bytes_gp"], sum(formula.values())))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("G", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_step_bytes_equal_the_measured_counters(G):
    cases = [(*c, False) for c in CASES] + [("dimenet++", "edge-chunk", "halo", True)]
    if G == 3:
        cases += [("gemnet-t", "atom-owner", "allgather", False), ("gemnet-t", "atom-owner", "halo", True)]
    outs = spawn(_measure, G, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=280)
    for r, rows in enumerate(outs):
        for case, (measured, formula) in zip(cases, rows):
            assert measured > 0, (case, r)
            assert measured == pytest.approx(formula, rel=1e-12, abs=0), (case, r, measured, formula)  # sum order


# ---------------------------------------------------------------------------------------------- memory, time, layouts
SMALL_DIMENET = {"int_emb_size": 4, "basis_emb_size": 3, "out_emb_channels": 6, "num_spherical": 3, "num_radial": 3}


def _profile(**kw):
    from gnnpipe.tasks.s2ef.cost import AtomProfile

    base = {"model": "dimenet++", "step_s": 1.0, "work": 1e9, "kappa": 2.5, "peak_bytes": 0, "grad_bytes": 0,
            "kept_bytes": 1.0, "edges": 1, "triplets": 1, "atoms": 1, "structures": 1, "element_size": 4,
            "step_cpu_s": 1.0}
    return AtomProfile(**{**base, **kw})


def _job(model, n: int = 3):
    from gnnpipe.tasks.s2ef.cost import AtomJob
    from tests.tasks.s2ef.toy import emt_clusters

    return AtomJob(model, emt_clusters(n, seed=5, dtype=torch.float32), 3.0, 8)


def test_layouts_cover_every_factorisation():
    from gnnpipe.tasks.s2ef.cost import enumerate_atom_layouts, stage_bounds

    lays = enumerate_atom_layouts(8, num_units=3, num_structures=4, chunks_per_stage=(1, 4))
    assert all(x.ranks == 8 for x in lays)
    assert {(x.stages, x.gp, x.replicas) for x in lays} == {(1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 1, 4),
                                                        (2, 2, 2), (2, 4, 1)}  # S = 4, 8 > 3 units
    assert {x.chunks for x in lays if x.stages == 2} == {2, 4}  # k·S capped at the replica's 4 structures
    assert not [x for x in enumerate_atom_layouts(8, 3, 4, stages=False) if x.stages > 1]
    assert stage_bounds(5, 2) == [(0, 3), (3, 5)] and stage_bounds(3, 3) == [(0, 1), (1, 2), (2, 3)]


def test_bubble_is_the_gpipe_idle_share():
    from gnnpipe.tasks.s2ef.cost import bubble

    assert bubble(1, 8) == 0 and bubble(4, 4) == pytest.approx(3 / 7) and bubble(2, 16) == pytest.approx(1 / 17)


def test_memory_arithmetic_states_split_by_stages_and_activations_by_ranks():
    from gnnpipe.tasks.s2ef.cost import (
        AtomLayout,
        activation_widths,
        num_parameters,
        predict_layout,
        rank_memory,
        unit_parameters,
    )

    model = _model("dimenet++")  # float64 built; the job says float32 (b = 4)
    job = _job(model)
    assert sum(unit_parameters(model)) == num_parameters(model)
    cache: dict = {}
    one = predict_layout(job, AtomLayout(1, 1, 1), _profile(), cache=cache)
    m = one.memory[0]
    P = num_parameters(model)
    assert (m.parameters, m.gradients, m.optimizer, m.allreduce) == (4 * P, 4 * P, 8 * P, 0)  # no all-reduce alone
    from gnnpipe.tasks.s2ef.cost import job_graph

    _, graph = job_graph(job, cache)
    kept = 4 * sum(w.total(graph.num_edges, graph.num_triplets, graph.num_nodes) for w in activation_widths(model))
    assert m.activations == int(2.5 * kept)
    gp = predict_layout(job, AtomLayout(1, 2, 1), _profile(), cache=cache)
    read = 2.5 * 4 * sum(w.read_edge for w in activation_widths(model)) * graph.num_edges  # allgather: all rows
    assert read > 0
    assert sum(r.activations for r in gp.memory) == pytest.approx(m.activations + read, rel=1e-6)  # shares add up
    assert all(r.allreduce == 8 * (P + 1) for r in gp.memory)  # the trainer's float64 flat buffer
    pipe = predict_layout(job, AtomLayout(2, 1, 1, chunks=2), _profile(), cache=cache)
    assert sum(r.parameters for r in pipe.memory) == 4 * P and len(pipe.memory) == 2
    assert all(r.allreduce == 0 for r in pipe.memory)  # a pure pipeline sums no gradients across ranks
    hybrid = predict_layout(job, AtomLayout(2, 2, 1, chunks=2), _profile(), cache=cache)
    assert [r.allreduce for r in hybrid.memory] == [r.parameters for r in hybrid.memory]  # the stage's, dtype b
    plan = cache[("plan", 2)]
    again = rank_memory(job, AtomLayout(1, 2, 1), plan, 2.5)
    assert [r.activations for r in again] == [r.activations for r in gp.memory]


@pytest.mark.parametrize("name", ["dimenet++", "schnet", "gemnet-t", "escn-md"])
def test_a_stage_counts_the_geometry_once_where_a_block_reads_it(name):
    from gnnpipe.tasks.s2ef.cost import (
        UnitWidths,
        activation_widths,
        boundary_widths,
        geometry_widths,
        stage_widths,
    )

    def add(ws):
        out = UnitWidths()
        for w in ws:
            out = out + w
        return out

    cons, direct = _model(name), _model(name, direct=True)
    n = len(cons.units)
    units = activation_widths(cons)
    assert stage_widths(cons, 0, n) == (add(units), UnitWidths())  # the single process: unit 0 holds the geometry
    g_cons, g_direct = geometry_widths(cons), geometry_widths(direct)
    assert g_cons == geometry_widths(direct, True) and g_direct.total(10, 100, 5) < g_cons.total(10, 100, 5)
    kept_direct, _ = stage_widths(direct, 0, n)
    assert kept_direct.total(10, 100, 5) == pytest.approx(
        add(activation_widths(direct)).total(10, 100, 5) - g_cons.total(10, 100, 5) + g_direct.total(10, 100, 5))
    bw = boundary_widths(cons)
    emb, emb_boundary = stage_widths(cons, 0, 1)  # the embedding alone: DimeNet++'s rbf keeps the edge geometry
    kept_edge = g_cons.edge * 10 if name != "schnet" else 0
    assert emb.total(10, 100, 5) == pytest.approx(units[0].total(10, 100, 5) - g_cons.total(10, 100, 5) + kept_edge)
    assert stage_widths(direct, 0, 1)[0].total(10, 100, 5) == pytest.approx(  # (GemNet-dT: output 0's force path;
        activation_widths(direct)[0].total(10, 100, 5) - g_cons.total(10, 100, 5)  # eSCN-MD: its radial MLP's input)
        + direct.embedding_stage_widths(False).total(10, 100, 5))
    seed = UnitWidths(bw.edge, 0, bw.atom + 3)  # conservative: the G seed received from the next stage, kept until B
    assert emb_boundary == bw + seed and stage_widths(direct, 0, 1)[1] == boundary_widths(direct)
    later, later_boundary = stage_widths(cons, 1, n)  # a later stage recomputes it
    assert later == add(units[1:]) + g_cons and later_boundary == bw
    middle = stage_widths(cons, 1, 2)[1]
    assert middle.total(10, 0, 5) == 2 * bw.total(10, 0, 5) + seed.total(10, 0, 5)


def test_a_profile_fitted_against_older_widths_is_refused():
    from gnnpipe.errors import ConfigError
    from gnnpipe.tasks.s2ef.cost import WIDTHS_VERSION, AtomProfile

    d = _profile().to_dict()
    assert AtomProfile.from_dict(d).widths_version == WIDTHS_VERSION
    old = {k: v for k, v in d.items() if k != "widths_version"}  # saved before the version existed
    with pytest.raises(ConfigError, match="profile again"):
        AtomProfile.from_dict(old)


@pytest.mark.parametrize("edit, match", [
    (lambda d: [1, 2], "a JSON list, not an object"),
    (lambda d: {**d, "step_s": "abc"}, "step_s='abc' must be numbers >= 0"),
    (lambda d: {**d, "kappa": -1}, "kappa=-1 must be numbers >= 0"),
    (lambda d: {**d, "kappa_d": -1}, "kappa_d=-1 must be numbers >= 0"),
    (lambda d: {**d, "edges": None}, "edges=None"),
    (lambda d: {**d, "bogus": 1}, "not an atomistic profile"),
])
def test_a_malformed_profile_is_refused_with_a_message(edit, match):
    from gnnpipe.errors import ConfigError
    from gnnpipe.tasks.s2ef.cost import AtomProfile

    with pytest.raises(ConfigError, match=re.escape(match)):
        AtomProfile.from_dict(edit(_profile().to_dict()))


def test_rank_memory_counts_the_steps_graph():
    from gnnpipe.tasks.s2ef.cost import AtomLayout, job_graph, predict_layout

    model = _model("dimenet++")
    job = _job(model)
    cache: dict = {}
    _, graph = job_graph(job, cache)
    one = predict_layout(job, AtomLayout(1, 1, 1), _profile(), cache=cache).memory[0]
    assert one.graph == 40 * graph.num_edges + 8 * graph.num_nodes + 16 * graph.num_triplets
    assert one.peak == one.states + one.allreduce + one.activations + one.graph


@pytest.mark.parametrize("direct", [False, True])
def test_a_conservative_pipeline_stage_peaks_at_kappa_d_on_its_largest_micro_batch(direct):
    """With conservative forces a stage's D pass retains the graph for B: one micro-batch (the largest) at κ_D, the
    others at κ (gpipe: every G has run) or their forward alone (1f1b); direct forces: k of the largest at κ."""
    from gnnpipe.tasks.s2ef.cost import (
        AtomLayout,
        job_graph,
        micro_batch_sizes,
        predict_layout,
        stage_bounds,
        stage_widths,
    )

    model = _model("gemnet-t", direct)
    job = _job(model, 5)
    cache: dict = {}
    _, graph = job_graph(job, cache)
    E, T, N = graph.num_edges, graph.num_triplets, graph.num_nodes
    mbs = micro_batch_sizes(job, 3, cache)  # structures [0, 1], [2, 3], [4], as the pipeline cuts them
    assert [tuple(map(sum, zip(*mbs)))] == [(E, T, N)] and len({m[0] for m in mbs}) > 1
    K = int(torch.bincount(graph.idx_ji, minlength=E).max())
    prof = _profile(kappa=2.0, kappa_d=3.0)
    for sched in ("gpipe", "1f1b"):
        mem = predict_layout(job, AtomLayout(2, 1, 1, 3, sched), prof, cache=cache).memory
        for s, ((lo, hi), m) in enumerate(zip(stage_bounds(len(model.units), 2), mem)):
            kept, boundary = stage_widths(model, lo, hi)
            whole = kept.total(E, T, N, E, E * K)
            big = max(kept.total(e, t, n, e, e * K) for e, t, n in mbs)
            k = 3 if sched == "gpipe" else 2 - s  # micro-batches in flight
            if direct:
                expect = 2.0 * min(k * big, whole)
            elif sched == "gpipe":
                expect = 2.0 * whole + (3.0 - 2.0) * big
            else:
                expect = 3.0 * big + min((k - 1) * big, whole - big)
            expect = 4 * (expect + boundary.total(E, 0, N) * k / 3)
            assert m.activations == pytest.approx(expect, rel=1e-6, abs=2), (sched, s)
    if not direct:  # the last 1f1b stage: one micro-batch at κ_D, not the mean one at κ
        last = predict_layout(job, AtomLayout(2, 1, 1, 3, "1f1b"), prof, cache=cache).memory[1]
        kept, _ = stage_widths(model, *stage_bounds(len(model.units), 2)[1])
        assert last.activations > 1.4 * 4 * 2.0 * kept.total(E, T, N, E, E * K) / 3
        old = predict_layout(job, AtomLayout(2, 1, 1, 3, "1f1b"), _profile(kappa=2.0), cache=cache).memory[1]
        assert old.activations < last.activations  # unmeasured κ_D: κ × DEFAULT_KAPPA_D_RATIO


def test_the_profile_measures_kappa_d_with_conservative_forces():
    from gnnpipe.tasks.s2ef.cost import DEFAULT_KAPPA_D_RATIO, AtomProfile, job_graph, profile_step

    for direct in (False, True):
        model = _model("gemnet-t", direct).float()
        batch, graph = job_graph(_job(model, 4))
        batch.energy, batch.forces = torch.zeros(batch.num_graphs), torch.zeros_like(batch.pos)
        prof = profile_step(model, batch, graph, steps=1, warmup=0)
        if direct:
            assert prof.kappa_d is None  # no D pass
        else:  # D retains the graph B reads: above the single process's combined backward
            assert prof.kappa_d > 1.05 * prof.kappa > 0
    old = {k: v for k, v in prof.to_dict().items() if k != "kappa_d"}  # saved before κ_D was measured
    assert AtomProfile.from_dict(old).retained_kappa == pytest.approx(prof.kappa * DEFAULT_KAPPA_D_RATIO)


def test_the_profiled_floor_leaves_out_the_weights_batch_and_graph_the_plan_counts_per_rank():
    """The plan adds each rank's parameters and graph to the floor; a floor read with the profiled model's weights
    and the sample's batch and graph resident would count them twice (256 MiB of tensors here)."""
    from gnnpipe.tasks.s2ef.cost import job_graph, profile_step
    from gnnpipe.tasks.s2ef.cost.profile import _held_bytes

    model = _model("schnet").float()
    batch, graph = job_graph(_job(model))
    batch.energy, batch.forces = torch.zeros(batch.num_graphs), torch.zeros_like(batch.pos)
    bare = profile_step(model, batch, graph, steps=1, warmup=0).floor_bytes
    batch.extra = torch.ones(16 << 20, dtype=torch.float64)  # 128 MiB, resident
    graph.extra = torch.ones(8 << 20, dtype=torch.float64)
    model.register_buffer("extra", torch.ones(8 << 20, dtype=torch.float64))
    assert _held_bytes(model, batch, graph) > 256 << 20
    heavy = profile_step(model, batch, graph, steps=1, warmup=0).floor_bytes
    assert abs(heavy - bare) < 48 << 20, (bare, heavy)  # without the correction: +256 MiB


def test_time_model_splits_the_profiled_step_by_work_and_adds_the_bubble():
    from gnnpipe.costmodel.hardware import Hardware, Link
    from gnnpipe.tasks.s2ef.cost import AtomLayout, job_graph, predict_layout, work_weights

    model = _model("dimenet++")
    job = _job(model)
    cache: dict = {}
    _, graph = job_graph(job, cache)
    work = sum(w.total(graph.num_edges, graph.num_triplets, graph.num_nodes) for w in work_weights(model))
    hw = Hardware("test", nodes=1, devices_per_node=8, kind="gpu", speed=2.0, intra=Link(0.0, 1e30))
    prof = _profile(step_s=4.0, work=float(work))
    one = predict_layout(job, AtomLayout(1, 1, 1), prof, hw, cache=cache)
    assert one.step_s == pytest.approx(2.0)  # the profiled step on a device twice as fast
    two = predict_layout(job, AtomLayout(1, 2, 1), prof, hw, cache=cache)
    assert max(two.compute_s) < 2.0 < sum(two.compute_s)  # halves, plus the edge rows both ranks read
    pipe = predict_layout(job, AtomLayout(3, 1, 1, chunks=3), prof, hw, cache=cache)
    heaviest = max(pipe.compute_s) * 3 / 5  # the stages' makespan is at most (C + S − 1)/C of the heaviest share
    assert 2.0 / 3 < heaviest < 2.0 and 0 < pipe.bubble < 1
    assert pipe.bytes["boundary"] > 0 and one.bytes["boundary"] == 0 and two.bytes["gp"] > 0


@schedulers.register("test-one-micro-batch-at-a-time")
class OneMicroBatchAtATime(schedulers.ChunkScheduler):
    """Direct forces: micro-batch ``c``'s forward through every stage and its backward back before ``c + 1``."""

    flush = True
    weight_staleness = 0

    def build(self, num_stages, chunk_order):
        order = schedulers.check_chunk_order(num_stages, chunk_order)
        S = num_stages
        slots: list[list] = [[None] * (2 * S * len(order)) for _ in range(S)]
        for k, c in enumerate(order):
            base = 2 * S * k
            for s in range(S):
                slots[s][base + s] = schedulers.F(s, c)
                slots[s][base + 2 * S - 1 - s] = schedulers.B(s, c)
        rows = [[a for a in row if a is not None] + [schedulers.STEP(s)] for s, row in enumerate(slots)]
        return self.schedule_from_orders(S, len(order), rows)


@pytest.mark.parametrize("conservative", [False, True])
def test_the_step_runs_the_layouts_own_schedule(conservative):
    """The stages' compute is the simulated schedule of the registered scheduler: equal stages give the textbook
    ``(C + S − 1)/C`` of a stage's work and bubble ``(S − 1)/(C + S − 1)`` for gpipe and 1f1b alike (direct
    forces; conservative forces' second-order schedules have more ramps), unequal stages wait for the heaviest, and
    a registered scheduler of the user's is costed as it runs."""
    from gnnpipe.tasks.s2ef.cost import AtomLayout, pipeline_compute

    for name in ("gpipe", "1f1b"):
        span, idle = pipeline_compute(AtomLayout(3, 1, 1, 4, name), conservative, [[1.0, 1.0, 1.0]])
        if conservative:  # F, G, D and B change direction three times: gpipe's phases add ramps
            assert span[0] >= 6 / 4 - 1e-9 and idle >= 2 / 6 - 1e-9
        else:
            assert span == [pytest.approx(6 / 4)] and idle == pytest.approx(2 / 6)
    span, _ = pipeline_compute(AtomLayout(3, 1, 1, 4, "gpipe"), conservative, [[1.0, 3.0, 1.0]])
    assert 3.0 < span[0] < 3.0 * 6 / 4
    assert pipeline_compute(AtomLayout(1, 2, 1), conservative, [[2.0], [3.0]]) == ([2.0, 3.0], 0.0)

    # a direct-force schedule of the user's, registered here: each micro-batch's forward and backward before the
    # next one's forward (no overlap across micro-batches): the prediction pays for it
    serial, _ = pipeline_compute(AtomLayout(3, 1, 1, 4, "test-one-micro-batch-at-a-time"), False, [[1.0, 1.0, 1.0]])
    assert serial[0] == pytest.approx(3.0)  # every pass of every micro-batch in sequence: the whole work, 3 stages


def test_projection_fits_by_arithmetic():
    """A 1e9-parameter DimeNet++ (meta device) needs 16 B/param of weights, gradients and Adam in fp32: 16 GB on
    one rank, 8 GB with S = 2; the memory column shows it and an 8-GPU H200 node fits it."""
    from gnnpipe.costmodel.hardware import load_hardware
    from gnnpipe.tasks.s2ef.cost import AtomLayout, num_parameters, predict_layout, size_for_params

    model, _ = size_for_params("dimenet++", 1e9, hidden=2048, **SMALL_DIMENET)
    P = num_parameters(model)
    assert abs(P - 1e9) / 1e9 < 0.05 and next(model.parameters()).device.type == "meta"
    job = _job(model, 1)
    hw = load_hardware("h200x8")
    one = predict_layout(job, AtomLayout(1, 1, 1), _profile(), hw)
    assert one.memory[0].parameters + one.memory[0].gradients + one.memory[0].optimizer == 16 * P
    two = predict_layout(job, AtomLayout(2, 1, 1, chunks=1), _profile(), hw)
    assert max(m.states for m in two.memory) < 0.6 * 16 * P and one.fits


@pytest.mark.slow  # ~8 s on the loaded 2-core machine: the neighbour graph and triplets of an OC20-sized slab
def test_plan_cli_for_an_atomistic_job(tmp_path, capsys):
    """``gnnpipe plan --task s2ef`` with a saved profile (no profiling here) prints the S x G x D ranking."""
    import json

    from gnnpipe.cli.main import main

    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps(_profile().to_dict()))
    rc = main(["plan", "--task", "s2ef", "--model", "dimenet++", "--layers", "2", "--hidden", "8", "--ranks", "4",
               "--batch-size", "1",
               "--plan-structures", "oc20-sized", "--hardware", "h200x8", "--profile-in", str(prof),
               "--params", "1e8", "--projection-hidden", "1024", "--chunks-per-stage", "1",
               *[f"--model-arg={k}={v}" for k, v in SMALL_DIMENET.items()], "--no-progress",
               "--out", str(tmp_path / "plan.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "S1xG4xD1" in out and "S2xG2xD1" in out and "fits" in out
    recs = json.loads((tmp_path / "plan.json").read_text())
    assert {r["layout"] for r in recs} == {"S1xG1xD4", "S1xG2xD2", "S1xG4xD1", "S2xG1xD2 C1 gpipe",
                                           "S2xG2xD1 C1 gpipe", "S4xG1xD1 C1 gpipe"}  # C ≤ the batch's 1 structure
