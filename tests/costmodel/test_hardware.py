"""The TOML hardware description: shipped examples, parsing, errors, placement, links and memory fits."""

import pytest

from gnnpipe.costmodel.hardware import Hardware, Link, load_hardware, parse_hardware, shipped_hardware
from gnnpipe.errors import ConfigError

GOOD = """
name = "two nodes"
[node]
count = 2
devices = 4
kind = "gpu"
memory_gib = 8
[device]
speed = 10.0
memory_gib = 1
[link.intra]
latency_us = 10
bandwidth_gbps = 10
[link.inter]
latency_us = 100
bandwidth_gbps = 1
"""


def test_shipped_examples_parse():
    names = shipped_hardware()
    assert {"local-2core", "cpu-16core", "paper-a5000"} <= set(names)
    paper = load_hardware("paper-a5000")
    assert (paper.nodes, paper.devices_per_node, paper.kind) == (2, 4, "gpu")
    assert paper.device_memory_bytes == 24 * 2**30
    assert paper.inter.bandwidth_Bps < paper.intra.bandwidth_Bps
    local = load_hardware("local-2core")
    assert local.devices_per_node == 2 and local.intra is None  # the measured link is used


def test_parse_file_placement_links_and_fits(tmp_path):
    p = tmp_path / "hw.toml"
    p.write_text(GOOD)
    hw = load_hardware(p)
    assert hw.speed == 10.0 and hw.intra.latency_s == pytest.approx(10e-6) and hw.intra.bandwidth_Bps == 10e9
    # 8 ranks in blocks of 4: ranks 0-3 on node 0
    assert [hw.node_of(r, 8) for r in range(8)] == [0] * 4 + [1] * 4
    measured = Link(1.0, 1.0)
    assert hw.link(0, 3, 8, measured) is hw.intra and hw.link(3, 4, 8, measured) is hw.inter
    assert hw.group_link([0, 5], 8, measured) is hw.inter
    assert Link(1e-3, 1e6).time(1e6) == pytest.approx(1.001) and Link(1e-3, 1e6).time(0) == 0.0
    assert Link(0.0, 1e6).allreduce_time(4e6, 4) == pytest.approx(2 * 3 * 1.0)
    gib = 2**30
    assert hw.fits([gib // 2] * 8)
    assert not hw.fits([gib // 2] * 7 + [2 * gib])  # one rank over its device's 1 GiB
    hw2 = Hardware(name="n", nodes=1, devices_per_node=2, node_memory_bytes=gib)
    assert hw2.fits([gib // 4] * 4) and not hw2.fits([gib // 2] * 3)  # the node's ranks share its memory


def test_missing_link_uses_measured():
    hw = Hardware(name="x", devices_per_node=2)
    m = Link(0.5, 2.0)
    assert hw.link(0, 1, 2, m) is m and hw.oversubscription(4) == 2.0


@pytest.mark.parametrize("text,match", [
    ("[node]\ndevices = 2\ncolour = 1\n", "unknown key"),
    ("gpus = 2\n", "unknown key"),
    ("[node]\ncount = 1\n", "needs devices"),
    ("[node]\ndevices = 0\n", "integer >= 1"),
    ("[node]\ndevices = 2\nkind = 'tpu'\n", r"bad\.toml: \[node\] kind"),  # the file, not the TOML's name
    ("[node]\ndevices = 2\n[device]\nspeed = -1\n", r"\[device\] speed"),
    ("[node]\ndevices = 2\n[device]\nmemory_gib = -1\n", r"\[device\] memory_gib"),
    ("[node]\ndevices = 2\nmemory_gib = -1\n", r"\[node\] memory_gib"),
    ("[node]\ndevices = 2\n[link.intra]\nlatency_us = 1\n", "bandwidth_gbps"),
    ("[node]\ndevices = 2\n[link.intra]\nlatency_us = 1\nbandwidth_gbps = 0\n",
     r"\[link\.intra\] bandwidth_gbps .*positive"),
    ("[node]\ndevices = 2\n[link.intra]\nlatency_us = 1\nbandwidth_gbps = 1e-320\n",
     r"\[link\.intra\] bandwidth_gbps .*at least"),
    ("[node]\ndevices = 2\n[device]\nspeed = 1e-12\n", r"\[device\] speed .*at least"),
    ("[node]\ndevices = 2\nmemory_gib = 1e308\n", r"\[node\] memory_gib .*at most"),
    ("[node]\ndevices = 2\n[link.inter]\nlatency_us = 1e308\nbandwidth_gbps = 1\n",
     r"\[link\.inter\] latency_us .*at most"),
    ("[node]\ndevices = 2\n[link.inter]\nlatency_us = -1\nbandwidth_gbps = 1\n", r"\[link\.inter\] latency_us"),
    ("[node]\ndevices = 2\n[link.inter]\nlatency_us = 1\nbandwidth_gbps = 1\nfoo = 1\n", r"in \[link\.inter\]"),
    ("[node]\ndevices = 2\n[link.inter]\nlatency_us = 1\nbandwidth_gbps = 1\nexchange_gbps = 100\n",
     "cannot exceed bandwidth_gbps"),
    ("[node]\ndevices = 2\n[link.wan]\nlatency_us = 1\nbandwidth_gbps = 1\n", "unknown link"),
])
def test_bad_descriptions_are_rejected_with_the_key(tmp_path, text, match):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_hardware(p)


def test_invalid_toml_and_missing_file(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("[node\ndevices = 2\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_hardware(p)
    with pytest.raises(ConfigError, match="paper-a5000"):  # lists the shipped names
        load_hardware(tmp_path / "nope.toml")
    p.write_bytes(b"\xff\xfe bad")  # not UTF-8: a clear error, not a UnicodeDecodeError
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_hardware(p)


def test_parse_dict_defaults():
    hw = parse_hardware({"node": {"devices": 3}})
    assert (hw.nodes, hw.kind, hw.speed, hw.intra, hw.inter) == (1, "cpu", 1.0, None, None)


def test_more_ranks_than_gpus_is_refused_and_cpu_cores_may_be_shared():
    """A GPU rank computes on a device of its own: ``check_ranks`` refuses more ranks than the machine's GPUs and
    names the limit; ranks sharing CPU cores are modelled (``shared_cores_bound``) and pass."""
    h200 = load_hardware("h200x8")
    h200.check_ranks(8)
    with pytest.raises(ConfigError, match=r"8 GPU\(s\).*16 ranks.*--ranks 8"):
        h200.check_ranks(16)
    load_hardware("local-2core").check_ranks(16)


def test_plan_refuses_more_ranks_than_gpus_before_profiling():
    from gnnpipe import api

    with pytest.raises(ConfigError, match="16 ranks need one each"):
        api.plan(ranks=16, hardware="h200x8", num_nodes=200, progress=False)


@pytest.mark.parametrize("bw", [0.0, -1.0, 1e-320, float("inf"), float("nan")])
def test_a_link_refuses_a_bandwidth_that_gives_no_finite_time(bw):
    with pytest.raises(ConfigError, match="bandwidth must be a finite number"):
        Link(1e-5, bw)
    with pytest.raises(ConfigError, match="exchange bandwidth"):
        Link(1e-5, 1e9, exchange_Bps=bw)
