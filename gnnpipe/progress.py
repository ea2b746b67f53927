"""The one rule for progress bars, shared by every command (``train``, ``compare``, ``ablate``).

A bar is drawn only when the caller wants one *and* its stream (standard error) is a terminal — tqdm's
``disable=None`` rule — so nothing redraws itself with carriage returns into pipes or log files; the
commands print plain lines there instead.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm


def progress_bar(*args: Any, enabled: bool = True, **kwargs: Any):
    """A ``tqdm.auto.tqdm`` on standard error that draws only on a terminal.

    Args:
        *args, **kwargs: as for ``tqdm`` (``file`` defaults to the current ``sys.stderr``,
            ``dynamic_ncols`` to ``True``).
        enabled: ``False`` never draws (``--no-progress``); ``True`` draws when the stream is a terminal.

    Returns:
        the ``tqdm`` object (a disabled one still iterates and accepts ``update``/``set_postfix_str``).
    """
    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(*args, disable=None if enabled else True, **kwargs)
