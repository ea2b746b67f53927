"""An S2EF trainer keeps glibc from retaining freed weight-sized tensors: once a process has freed one large block
(a pipeline stage dropping the weights of the units it does not run), glibc's default policy serves later blocks up
to that size from the heap, and freed temporaries between live blocks (gradients of the second-order pass, AdamW's)
stay resident, step after step. Each case runs in a fresh interpreter (the policy is process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gnnpipe.costmodel.live import live_bytes

pytestmark = pytest.mark.skipif(live_bytes() is None, reason="glibc's mallinfo2 is needed to read the heap")

#: builds a trainer (or not), then step after step frees weight-sized temporaries between small live tensors;
#: prints the heap's growth in MiB (glibc's ``arena``: bytes taken from the system for the heap, holes included)
SCRIPT = r"""
import json, sys
import torch
from gnnpipe.costmodel.live import _MALLINFO2

if sys.argv[1] == "trainer":  # "plain": without one (glibc's default policy)
    from tests.tasks.s2ef.test_graph_parallel import _config, _data
    from gnnpipe.tasks.s2ef.trainer import S2EFTrainer
    structures, splits, norm = _data()
    S2EFTrainer(_config("dimenet++"), structures, splits, norm)
big = torch.ones(8 << 20, dtype=torch.uint8)  # a large block freed: glibc's default threshold rises to 8 MiB
del big
base = _MALLINFO2().arena
live = []
for step in range(16):
    temps = [torch.ones(1 << 19) for _ in range(4)]  # four 2 MiB temporaries of a step
    live.append(torch.ones(64))  # a small tensor that outlives them
    del temps
print(json.dumps({"growth_mib": (_MALLINFO2().arena - base) / 2 ** 20}))
"""


def _growth(mode: str) -> float:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env, cwd=root,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["growth_mib"]


@pytest.mark.timeout(600)
def test_freed_weight_sized_temporaries_leave_no_resident_heap_after_a_trainer_is_built():
    # glibc's default policy keeps ~40 MiB of freed 2 MiB blocks in the heap here; the trainer's maps each alone
    assert _growth("trainer") < 1.0
