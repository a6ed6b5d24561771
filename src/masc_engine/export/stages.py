"""The export's stages: one line each (name, elapsed time, memory), and the memory plan.

``masc-export`` runs as a sequence of stages, each holding memory only while it runs (docs/export.md,
"Stages and memory"): the PyTorch stages in a worker process that ends before ONNX Runtime loads
the same weights (export/torch_worker.py), then one ONNX graph at a time for validation and for
each transform. :class:`StageClock` prints a line as each stage completes with its wall time, the
peak resident set size (RSS) of the process that ran it during the stage, and its RSS at the end;
the exporter records the same figures in the manifest (``export_stages``).

:func:`plan_memory` estimates the peak of a plan from the checkpoint's parameter sizes before any
stage touches the weights, and :func:`check_memory_plan` refuses in one line when the plan does not
fit the limit (``masc-export --max-memory-gb``, else the memory of this machine or container).

Peak RSS per stage (:class:`PeakSampler`): the largest of this process's RSS samples during the
stage, taken every 20 ms by a daemon thread (``/proc/self/statm``), and, when the process's
lifetime peak (``VmHWM``) rose during the stage, that peak: the sampler needs the GIL and misses
what a long C++ call holding it allocates and frees (the fp16 converter's shape inference at the
so400m shape: 6.9 GB sampled, 8.6 GB true), while a new lifetime peak can only come from the
stage in progress. (``VmHWM`` could be reset per stage through ``/proc/self/clear_refs``, but that
also resets the lifetime peak that ``getrusage``'s ``ru_maxrss`` and ``/usr/bin/time -v`` report.)
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.memory import release_heap
from ..errors import MascEngineError

logger = logging.getLogger(__name__)

GB = 1e9


class ExportMemoryError(MascEngineError):
    """The export plan's estimated peak memory is past the limit (``--max-memory-gb`` or the machine)."""


def rss(pid: int | str = "self") -> tuple[int, int]:
    """``(current, peak)`` resident set size in bytes of process ``pid`` (``VmRSS``, ``VmHWM``);
    ``(0, 0)`` where ``/proc`` is not available (not Linux)."""
    cur = peak = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return cur, peak


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class PeakSampler:
    """This process's peak RSS between :meth:`mark` calls, sampled every ``interval`` seconds by a
    daemon thread (one per process: :func:`peak_sampler`)."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self._peak = _rss_now()
        self._hwm = rss()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="masc-rss-sampler", daemon=True).start()

    def _run(self) -> None:
        while True:
            now = _rss_now()
            with self._lock:
                self._peak = max(self._peak, now)
            time.sleep(self.interval)

    def mark(self) -> int:
        """The peak (bytes) since the previous mark, the current RSS included; starts a new period."""
        now = _rss_now()
        hwm = rss()[1]
        with self._lock:
            peak, self._peak = max(self._peak, now), now
            rose, self._hwm = hwm > getattr(self, "_hwm", hwm), hwm
        return max(peak, hwm) if rose else peak


_SAMPLER: PeakSampler | None = None


def peak_sampler() -> PeakSampler:
    """This process's :class:`PeakSampler` (started on first use)."""
    global _SAMPLER
    if _SAMPLER is None:
        _SAMPLER = PeakSampler()
    return _SAMPLER


def release_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS (glibc ``malloc_trim(0)``):
    without the trim, glibc keeps a stage's freed buffers mapped and the next stage's peak sits on
    top of them."""
    gc.collect()
    release_heap()  # glibc only; a no-op elsewhere


#: Where the cgroup memory limit is read: v2 ``memory.max``, v1 ``memory.limit_in_bytes``.
CGROUP_MEMORY_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory_bytes(
    meminfo: str = "/proc/meminfo", cgroup_files: tuple[str, ...] = CGROUP_MEMORY_FILES
) -> int | None:
    """The memory this process may use, bytes: the smaller of ``MemTotal`` (``meminfo``) and the
    cgroup limits (each of ``cgroup_files`` that holds a number; ``max`` or a sentinel
    >= 2**60 is no limit); None where neither is known."""
    limits = []
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for p in cgroup_files:
        try:
            text = Path(p).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max" or a huge sentinel: no limit
            limits.append(int(text))
    return min(limits) if limits else None


@dataclass
class StageClock:
    """Times the export's stages and prints one line per stage as it completes.

    Each line is the stage's own message followed by
    ``[<stage>: <s> s, peak <p> GB, now <n> GB<where>]``: the peak RSS of the process that ran the
    stage during the stage (:class:`PeakSampler`), and its RSS when the stage ended (``where``:
    ``" (torch worker)"`` for stages run by export/torch_worker.py), logged at INFO on this
    module's logger. bench/export_memory.py parses these brackets.
    """

    records: list[dict] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str):
        """Run a stage in this process. The block may set ``note["message"]`` (the line's text)."""
        release_memory()
        sampler = peak_sampler()
        sampler.mark()
        t0 = time.time()
        note: dict = {}
        yield note
        release_memory()
        self.record(name, time.time() - t0, sampler.mark(), rss()[0], note.get("message", name))

    def record(self, name: str, seconds: float, peak: int, now: int, message: str, where: str = "") -> None:
        """Add a stage's figures (also for stages another process ran) and print its line."""
        self.records.append(
            {
                "stage": name,
                "seconds": round(seconds, 1),
                "peak_rss_gb": round(peak / GB, 3),
                "rss_gb_after": round(now / GB, 3),
                "process": where.strip(" ()") or "exporter",
            }
        )
        logger.info(f"{message} [{name}: {seconds:.1f} s, peak {peak / GB:.2f} GB, now {now / GB:.2f} GB{where}]")


#: The export plan's memory model: per stage, ``(fixed GB, multiple of the largest tower's fp32
#: weights, multiple of all fp32 weights)``. Fixed: the libraries (torch, transformers, onnx,
#: ONNX Runtime) and the processor. Measured by bench/export_memory.py (peak RSS of the process
#: running the stage; bench/results/export_memory_so400m.json, random base and so400m presets) and
#: rounded up so that the estimate stays above every measurement (by 5-25% at so400m).
MEMORY_MODEL = {
    # torch worker: lazily mapped safetensors, every weight read once (references, export); the
    # ONNX external-data writer streams tensors to disk. Measured 1.46 GB base, 4.00 GB so400m.
    "torch": (1.0, 0.0, 1.2),
    # one ONNX Runtime session on one graph (lean CPU memory) and its activations at 1024
    # patches. Measured 1.03 GB base, 2.54 GB so400m. The ONNX checker's stage (one graph's proto
    # at a time, weights inline in fp16 bundles) falls in it: measured 1.87 GB so400m fp16.
    "validate": (0.8, 1.6, 0.0),
    # the optimizer on the graph without its weights, then a session validating the fused graph
    # (ONNX Runtime folds the packed QKV at session creation). Measured 1.11 GB base, 3.29 GB so400m.
    "fuse": (0.8, 2.0, 0.0),
    # ONNX Runtime's fp16 converter on one fp32 graph: its ONNX shape inference serialises and
    # re-reads the whole model. Measured 2.28 GB base (before the fp32 graph was read once
    # instead of twice), 8.58 GB so400m.
    "precision": (0.8, 5.5, 0.0),
    # the fp32 and the reduced-precision bundles scored on the pair gates' pairs, one after the
    # other (every graph loaded). Measured 1.56 GB base, 5.13 GB so400m.
    "pairs": (0.8, 0.0, 1.6),
    # the bf16-cpu certification after the stages (export/cpu_precision.py): the fp32 bundle on ONNX
    # Runtime and the bf16 vision graph on OpenVINO scoring 158 calibration and 1,000 held-out pairs.
    # Measured 11.29 GB at so400m/1024 (bench/results/export_memory_so400m1024_bf16cpu.json), where
    # its weights are 3.36 GB, and 2.41 GB at base/256 (export_memory_base256_bf16cpu.json; 0.71 GB
    # of weights): the plan is 8 % and 33 % above them (activations grow with the patch budget too).
    "certify": (0.8, 0.0, 3.4),
    # ONNX Runtime's dynamic int8 quantizer on one fp32 graph (masc-export --precision int8): it
    # loads the graph with its weights and writes the quantized copy. Measured 5.29 GB (vision)
    # and 5.34 GB (text) at so400m, where each tower holds 1.65 GB of fp32 weights
    # (bench/results/export_memory_so400m1024_int8.json; the only measurement: base not measured).
    # The int8 gates that follow score the pairs with both bundles: the "pairs" stage (4.94 GB there).
    "quantize": (0.8, 3.0, 0.0),
}
#: What is made from the exported fp32 graphs in the same process, and the stages it adds to the
#: plan: the bf16-cpu certification, or int8's quantizer and its pair gates.
THEN_STAGES = {"bf16-cpu": ("certify",), "int8": ("quantize", "pairs")}


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated peak RSS per stage kind (bytes) and the parameter sizes they come from."""

    stages: dict
    tower_bytes: dict

    @property
    def peak(self) -> tuple[str, int]:
        return max(self.stages.items(), key=lambda kv: kv[1])


def plan_memory(
    tower_bytes: dict[str, int], precision: str = "fp32", fused: bool = True, then: str | None = None
) -> MemoryPlan:
    """The export plan's estimated peak per stage kind, from :data:`MEMORY_MODEL`.

    Args:
        tower_bytes: fp32 bytes of each exported graph's weights (``vision``, ``pool``, ``text``).
        precision: ``fp32``, ``fp16`` or ``bf16`` (the reduced ones add the converter's stage).
        fused: whether the fused ``ort-cpu`` variant is made.
        then: what the same process makes from the fp32 bundle next (:data:`THEN_STAGES`):
            ``bf16-cpu`` (the certification) or ``int8`` (quantizer and pair gates); None: nothing.
    """
    largest, total = max(tower_bytes.values()), sum(tower_bytes.values())
    kinds = (
        ["torch", "validate"]
        + (["fuse"] if fused else [])
        + ([] if precision == "fp32" else ["precision", "pairs"])
        + list(THEN_STAGES[then] if then else ())
    )
    stages = {}
    for k in kinds:
        fixed, per_graph, per_model = MEMORY_MODEL[k]
        stages[k] = int(fixed * GB + per_graph * largest + per_model * total)
    return MemoryPlan(stages, dict(tower_bytes))


def check_memory_plan(plan: MemoryPlan, max_memory_gb: float | None, model: str) -> str:
    """Refuse a plan whose estimated peak is past the limit; return a line describing the plan.

    The limit is ``max_memory_gb`` when given, else :func:`machine_memory_bytes`.

    Raises:
        ExportMemoryError: one line with the estimate, the stage that peaks and the limit.
    """
    stage, peak = plan.peak
    limit: int | None
    if max_memory_gb is not None:
        limit, source = int(max_memory_gb * GB), f"--max-memory-gb {max_memory_gb:g}"
    else:
        limit, source = machine_memory_bytes(), "this machine's memory"
    weights = ", ".join(f"{g} {b / GB:.2f} GB" for g, b in plan.tower_bytes.items())
    line = f"memory plan: peak about {peak / GB:.1f} GB in the {stage} stage (fp32 weights: {weights})"
    if limit is not None and peak > limit:
        raise ExportMemoryError(
            f"{model}: the export needs about {peak / GB:.1f} GB at its peak ({stage} stage; fp32 weights: {weights}), "
            f"more than {source} ({limit / GB:.1f} GB); export on a machine with more memory"
            + ("" if max_memory_gb is None else " or raise --max-memory-gb")
        )
    return line + (f", within {source} ({limit / GB:.1f} GB)" if limit else "")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
