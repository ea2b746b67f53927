"""A scheduler defined and registered here, in the test file, with no change to the library, goes
through validation, simulation, the staleness report and the CLI like the built-ins."""

import json

import numpy as np
import pytest

from gnnpipe import schedulers as gs
from gnnpipe.cli.main import main


@gs.register("test-gpipe-fifo")
class GPipeFifo(gs.ChunkScheduler):
    """GPipe with first-in-first-out backward: all forwards, then all backwards in forward order."""

    flush = True
    weight_staleness = 0

    def build(self, num_stages, chunk_order):
        order = gs.check_chunk_order(num_stages, chunk_order)
        rows = [[gs.F(s, c) for c in order] + [gs.B(s, c) for c in order] + [gs.STEP(s)]
                for s in range(num_stages)]
        return self.schedule_from_orders(num_stages, len(order), rows)


def test_registered_through_the_same_door():
    assert "test-gpipe-fifo" in gs.available()
    assert gs.get("test-gpipe-fifo") is GPipeFifo
    assert GPipeFifo().name == "test-gpipe-fifo"


@pytest.mark.parametrize("S, C, E", [(1, 1, 1), (3, 2, 1), (4, 8, 3)])
def test_validation_and_simulation(S, C, E):
    sch = gs.build_schedule("test-gpipe-fifo", S, C, epochs=E, order="shuffle", seed=1)
    assert sch.name == "test-gpipe-fifo" and sch.epochs == E
    gs.validate(sch)
    res = gs.simulate(sch)
    # B(s, first) must wait for every F on the last stage, so the FIFO drain costs the same as gpipe here
    assert res.makespan == E * 2 * (C + S - 1)
    assert res.peak_inflight == [C] * S


def test_staleness_report_differs_from_gpipe():
    ptr = [0, 1, 2, 3]
    ei = [[0, 1, 0, 2, 1, 2], [1, 0, 2, 0, 2, 1]]
    rep = gs.staleness_report(gs.build_schedule("test-gpipe-fifo", 2, 3), ptr, ei)
    assert rep.backward_fresh().tolist() == [[0.0, 0.5, 1.0]] * 2  # gpipe's reverse order gives [1, .5, 0]
    shuffled = gs.shuffled_staleness("test-gpipe-fifo", 2, ptr, ei, epochs=50, seed=3)
    assert np.all((shuffled.forward_fresh() > 0.2) & (shuffled.forward_fresh() < 0.8))


def test_cli_output(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "fifo.png"
    assert main(["schedule", "show", "test-gpipe-fifo", "-S", "3", "-C", "4", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "schedule 'test-gpipe-fifo'" in out and "0B0" in out
    assert png.stat().st_size > 0
    js = tmp_path / "fifo.json"
    assert main(["simulate", "test-gpipe-fifo", "-S", "3", "-C", "4", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["makespan"] == 12
    assert main(["schedule", "list"]) == 0
    assert "test-gpipe-fifo" in capsys.readouterr().out
