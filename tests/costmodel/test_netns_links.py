"""The link emulator of benchmarks/netns_links.py and the pure parts of benchmarks/bench_network_regime.py.

The fast tests check the arithmetic, the commands a mesh would run and the refusals; the slow test (root only)
makes a mesh, measures its link with the profile's ping-pong and checks that nothing is left behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


nl = _load("netns_links")
bench = _load("bench_network_regime")


def test_paper_scaled_rate_is_10_gbit_over_the_speed_factor():
    assert nl.scaled_rate(10e9 / 8, 40.0) == pytest.approx(31.25e6)  # 250 Mbit/s
    assert nl.scaled_rate(bench.PAPER_INTER_BPS, bench.PAPER_SPEED) * 8 / 1e6 == pytest.approx(250.0)
    with pytest.raises(ValueError):
        nl.scaled_rate(1e9, 0.0)


def test_tbf_settings_and_command():
    p = nl.tbf_params(31.25e6)
    assert p["rate_bit"] == 250_000_000
    assert p["burst"] == 65536  # 2 ms of 31.25 MB/s is 62.5 kB: the 64 KiB floor
    assert p["limit"] == int(31.25e6 * 0.2)
    assert nl.tbf_params(1.25e9)["burst"] == int(1.25e9 * 0.002)
    cmd = nl.tbf_command("gnlabcdefn0", "v1", 31.25e6)
    assert cmd[:4] == ["ip", "netns", "exec", "gnlabcdefn0"]
    assert cmd[cmd.index("rate") + 1] == "250000000bit" and "tbf" in cmd and cmd[cmd.index("dev") + 1] == "v1"
    with pytest.raises(ValueError):
        nl.tbf_params(0)


def test_mesh_commands_make_a_shaped_full_mesh_inside_its_namespaces():
    m = nl.Mesh(4, 31.25e6, token="abc123")
    cmds = m.commands()
    assert [c[3] for c in cmds if c[:3] == ["ip", "netns", "add"]] == [f"gnlabc123n{n}" for n in range(4)]
    veths = [c for c in cmds if "veth" in c]
    assert len(veths) == 6  # one pair per pair of nodes
    # every link is made directly inside two of the mesh's namespaces, never in the caller's
    assert all(c[c.index("netns") + 1].startswith("gnlabc123") for c in veths)
    assert all(c[c.index("peer") + 4].startswith("gnlabc123") for c in veths)
    tbfs = [c for c in cmds if "tbf" in c]
    assert len(tbfs) == 12  # both ends of each pair
    routes = [c for c in cmds if "route" in c]
    assert len(routes) == 12
    assert ["ip", "-n", "gnlabc123n2", "route", "add", "10.213.0.4/32", "dev", "v3", "src", "10.213.0.3"] in routes
    assert all(c[0] == "ip" for c in cmds)
    # addresses: one /32 per node on the veth named by ifname, in the 10.213.0.x range only
    addrs = [c for c in cmds if "addr" in c]
    assert [c[5] for c in addrs] == [f"10.213.0.{n + 1}/32" for n in range(4)]
    assert [c[-1] for c in addrs] == [m.ifname(n) for n in range(4)] == ["v1", "v0", "v0", "v0"]


def test_mesh_nodes_of_several_ranks_and_the_torchrun_environment():
    m = nl.Mesh(4, 31.25e6, intra_Bps=250e6, ranks_per_node=2, token="0f0f0f")
    cmds = m.commands()
    assert sum("veth" in c for c in cmds) == 1
    assert [c for c in cmds if "tbf" in c and "lo" in c] and len([c for c in cmds if "tbf" in c]) == 4
    e = m.env(3, 29600, base={})
    assert e["RANK"] == "3" and e["WORLD_SIZE"] == "4" and e["LOCAL_RANK"] == "1" and e["LOCAL_WORLD_SIZE"] == "2"
    assert e["MASTER_ADDR"] == "10.213.0.1" and e["MASTER_PORT"] == "29600" and e["GROUP_RANK"] == "1"
    assert e["GLOO_SOCKET_IFNAME"] == "v0"
    assert m.exec_argv(3, ["python", "x.py"]) == ["ip", "netns", "exec", "gnl0f0f0fn1", "python", "x.py"]
    assert nl.Mesh(2, 1e6).prefix != nl.Mesh(2, 1e6).prefix  # random tokens: concurrent meshes do not collide
    with pytest.raises(ValueError):
        nl.Mesh(3, 1e6, ranks_per_node=2)
    with pytest.raises(ValueError):
        nl.Mesh(2, 1e6, ranks_per_node=2)  # one node, nothing shaped


def test_refuses_without_root_or_tools():
    with pytest.raises(nl.NetnsError, match="root"):
        nl.check_environment(euid=1000)
    with pytest.raises(nl.NetnsError, match="tc not found"):
        nl.check_environment(euid=0, which=lambda t: None if t == "tc" else "/sbin/" + t)
    nl.check_environment(euid=0, which=lambda t: "/sbin/" + t)


def test_bench_refuses_when_not_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert bench.main(["--smoke"]) == 2
    assert "need root" in capsys.readouterr().err


def test_hardware_toml_of_the_set_rate_parses():
    from gnnpipe.costmodel.hardware import parse_hardware

    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib
    hw = parse_hardware(tomllib.loads(nl.hardware_toml("mesh", 4, 31.25e6, 2)))
    assert hw.inter.bandwidth_Bps == pytest.approx(31.25e6) and hw.intra.bandwidth_Bps == pytest.approx(31.25e6)
    assert hw.nodes == 1 and hw.devices_per_node == 2 and hw.kind == "cpu" and hw.inter.latency_s == 0.0
    assert hw.inter.per_pair and hw.intra.per_pair  # the mesh: a link of its own for every pair of ranks
    nic = parse_hardware(tomllib.loads(nl.hardware_toml("nic", 4, 31.25e6, 2, per_pair=False)))
    assert not nic.inter.per_pair and not nic.intra.per_pair


def test_hardware_exchange_rate_parses_and_is_checked():
    from gnnpipe.costmodel.hardware import Link, parse_hardware
    from gnnpipe.errors import ConfigError

    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib
    hw = parse_hardware(tomllib.loads(nl.hardware_toml("mesh", 2, 31.25e6, 2, exchange_Bps=15e6)))
    assert hw.inter.exchange_bandwidth_Bps == pytest.approx(15e6) and hw.intra.exchange_Bps == pytest.approx(15e6)
    assert hw.inter.bandwidth_Bps == pytest.approx(31.25e6)
    assert Link(0.0, 2e6).exchange_bandwidth_Bps == 2e6  # full duplex unless told otherwise
    with pytest.raises(ConfigError, match="exchange"):
        Link(0.0, 1e6, exchange_Bps=0.0)
    with pytest.raises(ConfigError, match="per_pair must be true or false"):
        parse_hardware({"node": {"devices": 1}, "link": {"inter": {"latency_us": 1, "bandwidth_gbps": 1,
                                                                   "per_pair": 1}}})
    with pytest.raises(ConfigError, match="exchange_gbps"):
        parse_hardware({"node": {"devices": 1}, "link": {"inter": {"latency_us": 1, "bandwidth_gbps": 1,
                                                                   "exchange_gbps": -1}}})


def test_hardware_cpu_per_byte_parses_and_is_checked():
    from gnnpipe.costmodel.hardware import Link, parse_hardware
    from gnnpipe.errors import ConfigError

    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib
    text = nl.hardware_toml("mesh", 2, 31.25e6, 2, cpu_s_per_byte=5.5e-9)
    assert text.count("cpu_ns_per_byte") == 2  # both links of the one node
    hw = parse_hardware(tomllib.loads(text))
    assert hw.inter.cpu_s_per_byte == pytest.approx(5.5e-9) and hw.intra.cpu_s_per_byte == pytest.approx(5.5e-9)
    plain = nl.hardware_toml("mesh", 2, 31.25e6, 2)
    assert "cpu_ns_per_byte" not in plain and parse_hardware(tomllib.loads(plain)).inter.cpu_s_per_byte == 0.0
    with pytest.raises(ConfigError, match="CPU per byte"):
        Link(0.0, 1e6, cpu_s_per_byte=-1e-9)
    with pytest.raises(ConfigError, match="cpu_ns_per_byte"):
        parse_hardware({"node": {"devices": 1}, "link": {"inter": {"latency_us": 1, "bandwidth_gbps": 1,
                                                                   "cpu_ns_per_byte": -1}}})


def test_layouts_prediction_pick_and_crossover():
    assert bench.layouts(4, ["gp", "gnnpipe", "hybrid"]) == {"gp": (4, 1, None), "gnnpipe": (1, 4, 16),
                                                               "hybrid": (2, 2, 16)}
    assert bench.layouts(2, ["gp", "hybrid"]) == {"gp": (2, 1, None)}
    recs = [{"ways": 1, "stages": 2, "chunks": 8, "over_partition": 4, "scheduler": "gpipe", "predicted_epoch_s": 1},
            {"ways": 1, "stages": 2, "chunks": 8, "over_partition": 4, "scheduler": "1f1b", "predicted_epoch_s": 2},
            {"ways": 2, "stages": 1, "chunks": 2, "over_partition": 1, "scheduler": "-", "predicted_epoch_s": 3}]
    assert bench.pick_prediction(recs, 1, 2, 8)["predicted_epoch_s"] == 2
    assert bench.pick_prediction(recs, 2, 1, None)["predicted_epoch_s"] == 3
    assert bench.pick_prediction(recs, 1, 4, 16) is None
    # GP: 1 s + 8 MB / rate; GNNPipe: 2 s + 1 MB / rate -> equal at 7 MB / 1 s = 7e6 B/s
    pts = {"gp": [(r, 1 + 8e6 / r) for r in (1e6, 4e6, 16e6)], "gnnpipe": [(r, 2 + 1e6 / r) for r in (1e6, 4e6, 16e6)]}
    assert bench.crossover(pts) == pytest.approx(7e6)
    assert bench.crossover({"gp": pts["gp"][:1], "gnnpipe": pts["gnnpipe"]}) is None
    assert bench.crossover({"gp": [(1e6, 1.0), (2e6, 0.5)], "gnnpipe": [(1e6, 2.0), (2e6, 1.5)]}) is None
    # an unshaped link (rate inf) is the fit's intercept
    inf = float("inf")
    assert bench.crossover({m: v + [(inf, 1.0 if m == "gp" else 2.0)] for m, v in pts.items()}) == pytest.approx(7e6)


def test_an_unshaped_mesh_has_no_qdisc():
    import math

    m = nl.Mesh(2, math.inf, token="abc123")
    cmds = m.commands()
    assert not any("tbf" in c for c in cmds) and sum("veth" in c for c in cmds) == 1
    assert any(c[-2:] == ["src", "10.213.0.1"] for c in cmds)  # addressed and routed as a shaped mesh


def test_job_arguments_carry_the_layer_split():
    assert "--layer-split" not in bench.job_args("Computers", 32, 100)
    argv = bench.job_args("synthetic:500", 8, 64, "profiled")
    assert argv[-2:] == ["--layer-split", "profiled"] and argv[:2] == ["--num-nodes", "500"]
    assert bench.job_name("Physics", 32, 100, "profiled") == "Physics GCNII-32 h100 profiled split"


def test_network_deltas_subtract_the_fastest_rate():
    rows = [{"job": "j", "ranks": 2, "layout": "GP 2x1", "rate_Bps": r, "mbit": r * 8 / 1e6, "epoch_s": e,
             "pred_epoch_s": p} for r, e, p in [(1e6, 5.0, 3.0), (4e6, 2.0, 1.5), (16e6, 1.0, 1.0)]]
    d = bench.network_deltas(rows)
    assert [(x["mbit"], x["measured_s"], x["predicted_s"], x["predicted_x_s"]) for x in d] == [
        (32.0, 1.0, 0.5, None), (8.0, 4.0, 2.0, None)]


def test_measured_row_skips_the_first_epoch():
    eps = [{"time_s": t, "idle_s": [0.1 * t, 0.0], "bytes_layer": 10, "bytes_graph": 20, "bytes_weight": 1}
           for t in (9.0, 2.0, 4.0)]
    row = bench.measured_row({"epochs": eps, "peak_mem_bytes": [2 ** 20, 3 * 2 ** 20]})
    assert row["epoch_s"] == 3.0 and row["bytes"] == 31 and row["peak_MiB_max"] == 3.0
    assert row["idle_fraction_max"] == pytest.approx(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")),
                    reason="needs root, ip and tc")
def test_emulated_link_has_the_set_rate_and_teardown_leaves_nothing():
    mesh = nl.Mesh(2, 31.25e6)  # the paper-scaled 250 Mbit/s
    with mesh:
        assert len(nl.residue(mesh.prefix)) == 2
        got = mesh.measure(reps=4)
    assert len(got) == 1 and 0.9 <= got[0]["ratio"] <= 1.1, got
    # the runtime's exchange (Comm.exchange, receives posted first) uses both directions at once: with the sends
    # posted first gloo's two directions took turns, 0.48-0.51 of the rate each
    assert got[0]["exchange_ratio"] >= 0.8, got
    # the host's CPU per byte carried: measured, finite, at least 0 (about 5 ns through tbf at this rate here)
    assert 0.0 <= got[0]["cpu_s_per_byte"] < 1e-6, got
    assert nl.residue(mesh.prefix) == []
    # a failure inside the block removes everything too
    mesh = nl.Mesh(3, 125e6)
    with pytest.raises(RuntimeError, match="boom"):
        with mesh:
            assert len(nl.residue(mesh.prefix)) == 3
            raise RuntimeError("boom")
    assert nl.residue(mesh.prefix) == []
    # and a rank that fails is reported, the others killed, the namespaces removed
    mesh = nl.Mesh(2, 125e6)
    with pytest.raises(nl.NetnsError, match="rank"):
        with mesh:
            mesh.run(lambda r: [sys.executable, "-c", f"import sys, time; time.sleep(60 * (1 - {r})); sys.exit(3)"],
                     timeout_s=30)
    assert nl.residue(mesh.prefix) == []
