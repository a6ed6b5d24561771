"""numpy's BLAS on one thread where a score is computed, so scores do not depend on thread count.

OpenBLAS (numpy's BLAS) splits a single-precision GEMM differently with 1 and with 2+ threads,
and the float32 results differ in the last bits: measured on the tiny NaFlex bundle, CP of 4 of 40
pairs changed by 6e-8 between ``OPENBLAS_NUM_THREADS=1`` (or ``OMP_NUM_THREADS=1``, which Ray
sets in its workers) and the default. A score must not depend on where it ran, so the cosine
matrices of CP (runtime/heads.py) run under a one-thread BLAS limit (threadpoolctl, the library
scikit-learn uses for this): the same bits in a Ray worker, a service and a local run. Cost:
at so400m/1024 a ``[1024, 1152] x [1152, 1024]`` product takes ~27 ms on one thread instead of
~13 ms on two (2-core x86_64), next to seconds of vision-tower time per image.

The limit is process-wide while it is held (BLAS thread counts are library globals), so it is
taken under a lock: concurrent scorers serialise their (short) CP products instead of racing to
restore each other's settings.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

_LOCK = threading.Lock()
_CONTROLLER: Any = None  # threadpoolctl.ThreadpoolController, made on first use


def _controller() -> Any:
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()  # inspects the loaded BLAS libraries once
    return _CONTROLLER


@contextmanager
def single_thread_blas() -> Iterator[None]:
    """Run the block with numpy's BLAS limited to one thread (restored afterwards)."""
    with _LOCK, _controller().limit(limits=1, user_api="blas"):
        yield
