"""Export-validation errors over many random initialisations: the distributions behind the budgets.

The per-shape budgets of ``tolerances.EXPORT_VALIDATION_RTOL_BUDGETS`` (SigLIP2) and
``tolerances.SEGMENTER_VALIDATION_BUDGETS`` / ``SEGMENTER_NOISE_FACTOR`` (CLIPSeg) are set from the
*maximum* over initialisations, with a stated margin, not from one model. For each shape this
script builds ``--seeds`` checkpoints with other seeds than the shipped presets
(export/random_models.py uses seed 0), the families alternating seed by seed:

- ``default``: transformers' own initialisation (CLIPSeg logits already in the hundreds);
- ``trained-like``: every Linear / Conv weight scaled by a factor drawn in [1.2, 2] per
  tensor (larger weight norms), LayerNorm gains drawn in [0.3, 3] and biases N(0, 0.5) per
  channel, embeddings x 2: activations and logits of other scales than the default's.

Each checkpoint is exported by masc-export's own code (export/exporter.py or export/segmenter.py),
its validation run as usual, under an override that accepts any figure so that an initialisation
past today's budget is measured, not refused. Recorded per check: max |error|, max relative error
(max |error| / max |reference|, the figure the budgets bound), the budget applied and, for the
segmenter's decoder and end to end, transformers' own float32 relative error on the checkpoint
(``noise_rel``: against a float64 copy) and the ratio of the two. Then the same graphs are checked
against the checkpoint with one weight perturbed (:func:`perturbed`): the figures of a wrong graph,
to show the budgets still refuse it. Per shape and family: the median and max over initialisations.
The results file is rewritten after every initialisation (``--resume`` measures only the seeds it
lacks), so a run cut short keeps what it measured.

The embedder presets (``tolerances.EMBEDDER_VALIDATION_BUDGETS``) go the same way through
export/embedders.py: CLIP's image and text graphs, DINO's and DINOv2's image graph, the wrong graph
an output LayerNorm bias + 0.5 in one channel.

Shapes: ``tiny-naflex`` (SigLIP2 width 64, 2 layers), ``clipseg-tiny`` (the test preset),
``clipseg-tiny-3`` (text 32 x 2, vision 32 x 3 layers, projection 32, reduce_dim 16, extract
layers [1, 2]: a checkpoint of this shape was once refused at the decoder), and the real shapes
``base-naflex``, ``clipseg-rd64``, ``so400m-naflex`` (about 10 minutes per base export on 2 shared
cores). One command per results file:

    python bench/tolerance_distributions.py --seeds 10 --shapes tiny-naflex
    python bench/tolerance_distributions.py --seeds 10 --shapes clipseg-tiny,clipseg-tiny-3 \
        --out bench/results/tolerance_distributions_clipseg-tiny.json
    python bench/tolerance_distributions.py --seeds 10 --shapes base-naflex \
        --out bench/results/tolerance_distributions_base-naflex.json
    python bench/tolerance_distributions.py --seeds 10 --shapes clipseg-rd64 \
        --out bench/results/tolerance_distributions_clipseg-rd64.json
    python bench/tolerance_distributions.py --seeds 10 --shapes clip-tiny,dino-tiny-s16,dino-tiny-s8,dinov2-tiny \
        --out bench/results/tolerance_distributions_embedders_tiny.json
    python bench/tolerance_distributions.py --seeds 10 --shapes clip-b32,dino-s16 \
        --out bench/results/tolerance_distributions_embedders.json    # about 45 s an initialisation

(``--resume`` to extend a file; ``--jobs 1`` by default: one export at a time.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SIGLIP_CHECKS = ("vision", "pool", "text")
SEGMENTER_CHECKS = ("vision", "text", "decoder", "end_to_end")
#: Seeds of the measured initialisations start here (the shipped presets use 0; the slow test's
#: held-out initialisations use 9001+).
FIRST_SEED = 100


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for the results file."""
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def _extra_segmenter_presets():
    from masc_engine.export import random_models as rm

    tiny = rm.SEGMENTER_PRESETS["clipseg-tiny"]
    return {
        "clipseg-tiny-3": dataclasses.replace(
            tiny, vision_width=32, vision_layers=3, vision_mlp=64, text_width=32, text_layers=2, extract_layers=(1, 2)
        )
    }


def trained_like(model, seed: int) -> None:
    """Rescale ``model``'s weights in place as trained weights differ from an initialisation (see
    the module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    u = lambda lo, hi, *shape: lo + (hi - lo) * torch.rand(*shape, generator=g)  # noqa: E731
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.LayerNorm) and mod.weight is not None:
                mod.weight.copy_(u(0.3, 3.0, mod.weight.shape))
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.5)
            elif isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
                mod.weight.mul_(float(u(1.2, 2.0, 1)))
            elif isinstance(mod, torch.nn.Embedding):
                mod.weight.mul_(2.0)


def build(shape: str, seed: int, family: str, work: Path) -> Path:
    """A checkpoint folder of ``shape`` with ``seed`` (and rescaled when ``family`` is trained-like)."""
    from masc_engine.export import random_models as rm

    presets = (
        rm.SEGMENTER_PRESETS
        if shape.startswith("clipseg")
        else rm.EMBEDDER_PRESETS
        if shape in rm.EMBEDDER_PRESETS
        else rm.PRESETS
    )
    presets.update({k: v for k, v in _extra_segmenter_presets().items() if k not in presets})
    saved = presets[shape]
    presets[shape] = dataclasses.replace(saved, seed=seed)
    out = work / f"{shape}-{family}-{seed}"
    try:
        rm.build_random_checkpoint(shape, out)
    finally:
        presets[shape] = saved
    if family == "trained-like":
        import transformers

        cls = transformers.CLIPSegForImageSegmentation if shape.startswith("clipseg") else transformers.AutoModel
        model = cls.from_pretrained(out).eval()
        trained_like(model, seed)
        model.save_pretrained(out)
    (out / "masc_random_model.json").unlink(missing_ok=True)  # a user's checkpoint, as far as the export knows
    return out


#: Accepts every figure: an initialisation past today's budget is measured, not refused.
ACCEPT_ALL = 1e30


def _figures(report: dict) -> dict:
    """The figures of one check's report: max |error|, max relative error, the budget it was held
    to and, where the check has one, transformers' own float32 relative error (``noise_rel``)."""
    out = {
        "max_abs": report["max_abs"],
        "max_rel": max(k["max_rel"] for k in report["cases"]),
        "rtol": report.get("rtol"),
        "past_budget": "override" in report,
    }
    if "noise_rel" in report:
        out.update(noise_rel=report["noise_rel"], error_over_noise=report["error_over_noise"])
    return out


def perturbed(shape: str, ckpt: Path, bundle: Path, accept: float | None = ACCEPT_ALL) -> dict:
    """The validation figures of the exported graphs against a checkpoint with one weight
    perturbed (what a wrong graph looks like to the validation): CLIPSeg's FiLM bias + 0.5 (as
    tests/test_segmenter.py), SigLIP2's output LayerNorm bias + 0.5 in one channel (vision
    ``post_layernorm``, pooling head ``layernorm``, text ``final_layer_norm``). ``accept``: the
    override the checks run under (None: none, the first check past its budget raises
    ExportValidationError)."""
    import torch

    from masc_engine.export.validate import accept_validation_error

    man = json.loads((bundle / "manifest.json").read_text())
    out = {}
    with torch.no_grad(), accept_validation_error(accept):
        if shape.startswith("clipseg"):
            from masc_engine.export import segmenter_validate as sv
            from masc_engine.export.segmenter import load_segmenter

            m, processor, _ = load_segmenter(str(ckpt))
            m.decoder.film_add.bias += 0.5
            out["decoder"] = _figures(
                sv.validate_graph(
                    "decoder",
                    bundle / man["graphs"]["decoder"]["file"],
                    bundle,
                    m,
                    processor,
                    man["image"],
                    man["text"],
                )
            )
            out["end_to_end"] = _figures(sv.validate_end_to_end(bundle, m, processor))
        elif _is_embedder(shape):
            out = _embedder_perturbed(ckpt, bundle, man)
        else:
            import transformers

            from masc_engine.export import validate as val

            model = transformers.AutoModel.from_pretrained(ckpt, attn_implementation="eager").eval()
            processor = transformers.AutoProcessor.from_pretrained(ckpt)
            vm = model.vision_model
            for graph, ln in (
                ("vision", vm.post_layernorm),
                ("pool", vm.head.layernorm),
                ("text", model.text_model.final_layer_norm),
            ):
                ln.bias[0] += 0.5
                refs = val.torch_references(model, processor, man["image"], man["text"], bundle, graphs=(graph,))
                out[graph] = _figures(val.check_graph(graph, bundle / man["graphs"][graph]["file"], refs))
                ln.bias[0] -= 0.5
    return out


def _is_embedder(shape: str) -> bool:
    from masc_engine.export import random_models as rm

    return shape in rm.EMBEDDER_PRESETS


def _embedder_perturbed(ckpt: Path, bundle: Path, man: dict) -> dict:
    """An embedder's graphs against its checkpoint with one output LayerNorm bias + 0.5 in one
    channel (CLIP: the image tower's ``post_layernorm``, the text tower's ``final_layer_norm``;
    DINO and DINOv2: the final ``layernorm``), each graph checked by export/embedders_validate.py."""
    from masc_engine.export import embedders_validate as ev
    from masc_engine.export.embedders import load_embedder

    m, processor, _, family, _ = load_embedder(str(ckpt))
    if family == "clip":
        targets = {"image": m.vision_model.post_layernorm, "text": m.text_model.final_layer_norm}
    else:
        targets = {"image": m.layernorm}
    out = {}
    for graph, ln in targets.items():
        ln.bias[0] += 0.5
        path = bundle / man["graphs"][graph]["file"]
        out[graph] = _figures(ev.validate_graph(graph, path, m, processor, family, man.get("text")))
        ln.bias[0] -= 0.5
    return out


def export(shape: str, ckpt: Path, out: Path) -> None:
    """Export ``ckpt`` (a checkpoint of ``shape``) to ``out`` with masc-export's own code for its
    kind: export/segmenter.py, export/embedders.py or export/exporter.py (fp32, validated)."""
    if shape.startswith("clipseg"):
        from masc_engine.export.segmenter import export_segmenter_bundle

        export_segmenter_bundle(str(ckpt), out)
    elif _is_embedder(shape):
        from masc_engine.export.embedders import export_embedder_bundle

        export_embedder_bundle(str(ckpt), out)
    else:
        from masc_engine.export.exporter import export_bundle

        export_bundle(str(ckpt), out, ort_cpu_variant=False)


def measure(shape: str, seed: int, family: str, work: Path) -> dict:
    """Export one initialisation and return its validation figures, and those of the same graphs
    against the checkpoint with one weight perturbed (:func:`perturbed`)."""
    from masc_engine.export.validate import accept_validation_error

    ckpt = build(shape, seed, family, work)
    out = work / (ckpt.name + ".bundle")
    t0 = time.time()
    seg, emb = shape.startswith("clipseg"), _is_embedder(shape)
    with accept_validation_error(ACCEPT_ALL):
        export(shape, ckpt, out)
    seconds = round(time.time() - t0, 1)
    v = json.loads((out / "manifest.json").read_text())["validation"]
    checks = SEGMENTER_CHECKS if seg else tuple(v) if emb else SIGLIP_CHECKS
    row = {
        "shape": shape,
        "seed": seed,
        "family": family,
        "seconds": seconds,
        "checks": {c: _figures(v[c]) for c in checks},
    }
    try:
        row["perturbed"] = perturbed(shape, ckpt, out)
    except Exception as e:  # noqa: BLE001 - the export's figures are kept; the failure is recorded
        row["perturbed"], row["perturbed_error"] = {}, f"{type(e).__name__}: {e}"
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return row


def summarise(rows: list[dict]) -> dict:
    """Per shape, family (and ``all``) and check: n, median and max of max |error| and relative error."""
    out: dict = {}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape]
        out[shape] = {}
        for family in ["all", *dict.fromkeys(r["family"] for r in mine)]:
            fam = [r for r in mine if family in ("all", r["family"])]
            out[shape][family] = {}
            for c in fam[0]["checks"]:
                s = {"n": len(fam)}
                for fig in ("max_abs", "max_rel", "noise_rel", "error_over_noise"):
                    vals = [r["checks"][c][fig] for r in fam if fig in r["checks"][c]]
                    if not vals:
                        continue
                    s[f"median_{fig}"], s[f"max_{fig}"] = statistics.median(vals), max(vals)
                    s[f"max_over_median_{fig}"] = round(max(vals) / statistics.median(vals), 2)
                wrong = [r["perturbed"][c] for r in fam if c in r.get("perturbed", {})]
                if wrong:  # a wrong graph's figures: the least of them, and its least ratio to the budget
                    s["perturbed_min_max_rel"] = min(w["max_rel"] for w in wrong)
                    s["perturbed_min_over_budget"] = min(w["max_rel"] / w["rtol"] for w in wrong)
                out[shape][family][c] = s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="initialisations per shape, split between the families")
    ap.add_argument("--jobs", type=int, default=1, help="exports at once (each in its own process)")
    ap.add_argument("--shapes", default="tiny-naflex,clipseg-tiny,clipseg-tiny-3")
    ap.add_argument("--families", default="default,trained-like")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "tolerance_distributions.json"))
    ap.add_argument("--resume", action="store_true", help="keep the runs already in --out, measure the others")
    a = ap.parse_args()
    import onnxruntime
    import torch
    import transformers

    families = a.families.split(",")
    seeds = range(FIRST_SEED, FIRST_SEED + a.seeds)
    # per shape, the families alternate seed by seed (a run cut short still holds both)
    tasks = [
        (shape, seed, families[(seed - FIRST_SEED) % len(families)]) for shape in a.shapes.split(",") for seed in seeds
    ]
    out = Path(a.out)
    rows = json.loads(out.read_text())["runs"] if a.resume and out.exists() else []
    done = {(r["shape"], r["seed"], r["family"]) for r in rows}
    tasks = [t for t in tasks if t not in done]
    t0 = time.time()

    def write() -> None:
        result = {
            "script": "bench/tolerance_distributions.py",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.machine()},
            "command": "python bench/tolerance_distributions.py " + " ".join(sys.argv[1:]),
            "environment": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnxruntime": onnxruntime.__version__,
                "machine": platform.machine(),
            },
            # the versions the measurements were made with (the results files' common field)
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnxruntime": onnxruntime.__version__,
            },
            "seeds": sorted({r["seed"] for r in rows}),
            "seconds": round(time.time() - t0),
            "summary": summarise(rows),
            "runs": rows,
        }
        out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

    with (
        tempfile.TemporaryDirectory(prefix="masc-tol-") as tmp,
        ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        futures = [pool.submit(measure, *t, Path(tmp)) for t in tasks]
        for f in futures:
            rows.append(f.result())
            r = rows[-1]
            print(
                f"{r['shape']} {r['family']} seed {r['seed']}: "
                + ", ".join(
                    f"{c} {x['max_rel']:.2e} rel"
                    + (f" ({x['error_over_noise']:.2g} x noise)" if "noise_rel" in x else "")
                    + (f", wrong {r['perturbed'][c]['max_rel']:.2e}" if c in r["perturbed"] else "")
                    for c, x in r["checks"].items()
                )
                + f" ({r['seconds']:.0f} s)",
                flush=True,
            )
            write()  # after every initialisation: a run stopped early keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
