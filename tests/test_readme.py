"""The README's Python examples run as written (issue #17, item 13), on a small graph with small settings.

Each ```python block is run as a script (``python script.py``, so that the local ranks, started with
'spawn', re-import it as ``__mp_main__`` and see its registrations, as a user's script would). Only in the
parent process, before the block runs, ``gnnpipe.data.load_dataset`` is replaced by a small synthetic graph
and ``api.train`` by a wrapper that shrinks the config's sizes (layers, hidden, epochs, stages, chunks);
every other setting — scheduler, correctors, model options — is the README's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

WRAPPER = '''
import attrs

import gnnpipe.api as _api
import gnnpipe.data as _data

_real_train = _api.train


def _small_graph(*args, **kwargs):
    return _data.synthetic_graph(num_nodes=80, avg_degree=5.0, num_classes=3, num_features=8,
                                 train_per_class=5, val_per_class=5, seed=0)


def _small_train(config=None, **kw):
    config = attrs.evolve(config, layers=2, hidden=8, epochs=1, patience=0, stages=min(config.stages, 2),
                          chunks=min(config.chunks or 1, 4))
    return _real_train(config, **kw)


if __name__ == "__main__":
    _data.load_dataset = _small_graph
    _api.train = _small_train

exec(compile(open({block!r}).read(), "README.md python block {index}", "exec"), {{"__name__": __name__}})
'''


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples():
    assert python_blocks(), "README.md has no ```python block"


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_example_runs(index, tmp_path):
    code = python_blocks()[index]
    block = tmp_path / f"block{index}.py"
    block.write_text(code)
    script = tmp_path / "run_block.py"
    script.write_text(WRAPPER.format(block=str(block), index=index))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    registered = re.findall(r'register\("([^"]+)"\)', code)
    saved = re.findall(r'\.save\("([^"]+)"\)', code)
    if saved:
        config = json.loads((tmp_path / saved[0]).read_text())["config"]
        for name in registered:  # what the example registers is what it trains with
            assert name in (config["scheduler"], config["model"], config["partitioner"], config["layer_split"],
                            *config["correctors"]), (name, config)
        given = re.search(r"model_args=(\{[^}]*\})", code)
        if given:
            assert config["model_args"] == eval(given.group(1))  # noqa: S307 - the README's own literal
