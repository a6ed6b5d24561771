"""A bundle reads only files inside its own folder, hashed, and refuses a bad one in one line.

Every file a manifest names (graphs, their variants and external data, the tokenizer) and every
external-data ``location`` inside a graph must resolve inside the bundle folder (no ``..``, no
absolute path, no symlink out), and with verification on, every byte the runtime reads is
hashed. Manifest numbers are range-checked at load. Each refusal is one line: a ``BundleError``
from the API, one ``Error:`` line (exit 1, no traceback) from masc-run and masc-rank, one
``load_failed`` line from masc-serve. The tampered bundles are copies of the tiny test bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import EXAMPLES, REPO
from masc_engine.engine.bundle import Bundle
from masc_engine.errors import BundleError


# ------------------------------------------------------------------ tampered copies


@pytest.fixture
def bundle(naflex_bundle, tmp_path) -> Path:
    """A private copy of the tiny NaFlex bundle at ``tmp_path/bundle``; ``tmp_path/outside``
    is a sibling folder for files that must not be read."""
    b = tmp_path / "bundle"
    shutil.copytree(naflex_bundle, b)
    (tmp_path / "outside").mkdir()
    return b


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _edit(b: Path, change) -> None:
    """Apply ``change(manifest)`` to ``b/manifest.json`` (hashes are whatever ``change`` sets)."""
    m = json.loads((b / "manifest.json").read_text())
    change(m)
    (b / "manifest.json").write_text(json.dumps(m, indent=2))


def _rehash(b: Path, *names: str) -> None:
    def change(m):
        for n in names:
            m["files"][n] = _sha(b / n)

    _edit(b, change)


def _halved_weights(src: Path, dst: Path) -> None:
    """``dst``: the float32 weights of ``src`` halved (scores change; nothing else does)."""
    (np.fromfile(src, dtype=np.float32) * np.float32(0.5)).tofile(dst)


def _relocate_external_data(graph: Path, location: str) -> None:
    onnx = pytest.importorskip("onnx", reason="rewriting a graph's external data needs onnx (export extra)")
    from onnx.external_data_helper import _get_all_tensors

    model = onnx.load(str(graph), load_external_data=False)
    for t in _get_all_tensors(model):
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    graph.write_bytes(model.SerializeToString())


def _masc_run(b: Path, tmp_path: Path, pairs: Path = EXAMPLES / "pairs.csv") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.run_cmd",
            str(pairs),
            "--bundle",
            str(b),
            "--out",
            str(tmp_path / "scores.csv"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The command failed with exit 1 and exactly one ``Error:`` line on stderr, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, proc.stderr[-4000:]
    return lines[0]


def _refused_by_masc_run(b: Path, tmp_path: Path, *parts: str, pairs: Path = EXAMPLES / "pairs.csv") -> str:
    line = _one_error_line(_masc_run(b, tmp_path, pairs))
    for p in parts:
        assert p in line, line
    assert not (tmp_path / "scores.csv").exists()
    return line


# ------------------------------------------------------------------ names that leave the folder


@pytest.mark.slow
def test_graph_named_through_dotdot_with_its_hash_is_refused(bundle, tmp_path):
    """The fused vision graph at ``../outside/`` (its sha256 listed), reading halved weights
    beside it: refused before anything is read from there."""
    out = tmp_path / "outside"
    shutil.copy(bundle / "vision.ort-cpu.onnx", out / "vision.ort-cpu.onnx")
    _halved_weights(bundle / "vision.onnx.data", out / "vision.onnx.data")
    name = "../outside/vision.ort-cpu.onnx"

    def change(m):
        m["graphs"]["vision"]["variants"]["ort-cpu"]["file"] = name
        m["files"][name] = _sha(out / "vision.ort-cpu.onnx")

    _edit(bundle, change)
    with pytest.raises(BundleError, match=r"graphs\.vision\.variants\.ort-cpu\.file names '\.\./outside/"):
        Bundle(bundle)
    line = _refused_by_masc_run(bundle, tmp_path, "'../outside/vision.ort-cpu.onnx'", "'..' part")
    assert line.startswith(f"Error: bundle {bundle}: manifest ")


@pytest.mark.slow
def test_absolute_graph_name_is_refused(bundle, tmp_path):
    target = tmp_path / "outside" / "pool.onnx"
    shutil.copy(bundle / "pool.onnx", target)

    def change(m):
        m["graphs"]["pool"]["file"] = str(target)
        m["files"][str(target)] = _sha(target)

    _edit(bundle, change)
    with pytest.raises(BundleError, match="is an absolute path"):
        Bundle(bundle, verify=False)
    _refused_by_masc_run(bundle, tmp_path, "graphs.pool.file", str(target), "absolute path")


@pytest.mark.parametrize("name", ["pool.onnx", "vision.onnx.data", "tokenizer.json"])
@pytest.mark.slow
def test_symlink_leading_out_is_refused(bundle, tmp_path, name):
    """Same bytes, same hash, but a symlink to a file outside the folder: refused."""
    target = tmp_path / "outside" / name
    shutil.move(bundle / name, target)
    (bundle / name).symlink_to(target)
    with pytest.raises(BundleError, match="symlink leading out of the bundle folder"):
        Bundle(bundle)
    _refused_by_masc_run(bundle, tmp_path, f"'{name}'", "symlink leading out of the bundle folder")


def test_symlinks_inside_the_folder_are_followed_and_what_the_graph_reads_is_hashed(bundle):
    """A weight file moved to a subfolder behind a symlink inside the bundle still loads, and
    the fused graph's own external-data file is confined and hashed when the graph is used."""
    (bundle / "weights").mkdir()
    shutil.move(bundle / "vision.onnx.data", bundle / "weights" / "vision.onnx.data")
    (bundle / "vision.onnx.data").symlink_to(Path("weights") / "vision.onnx.data")
    b = Bundle(bundle)
    assert b.graph_file("vision", "ort-cpu") == bundle / "vision.ort-cpu.onnx"
    assert b._graphs_checked == {"vision.ort-cpu.onnx"}
    assert b._verified == {"vision.ort-cpu.onnx", "vision.onnx.data"}
    for g in ("vision", "text"):
        for v in b.variants:
            assert b.graph_file(g, v).is_file()
    assert b._graphs_checked == {"vision.ort-cpu.onnx", "vision.onnx", "text.ort-cpu.onnx", "text.onnx"}


@pytest.mark.slow
def test_tokenizer_named_etc_passwd_is_refused(bundle, tmp_path):
    passwd = Path("/etc/passwd")
    if not passwd.is_file():
        pytest.skip("no /etc/passwd on this system")

    def change(m):
        m["text"]["tokenizer_file"] = str(passwd)
        m["files"][str(passwd)] = _sha(passwd)

    _edit(bundle, change)
    with pytest.raises(BundleError, match=r"text\.tokenizer_file names '/etc/passwd', which is an absolute path"):
        Bundle(bundle)
    _refused_by_masc_run(bundle, tmp_path, "text.tokenizer_file", "'/etc/passwd'")


# ------------------------------------------------------------------ external data named inside a graph


@pytest.mark.slow
def test_external_data_location_outside_is_refused(bundle, tmp_path):
    """The fused graph itself points its weights at ``../outside/`` (halved weights there), its
    own hash updated; the manifest still lists the bundle's intact weight file."""
    _halved_weights(bundle / "vision.onnx.data", tmp_path / "outside" / "vision.onnx.data")
    _relocate_external_data(bundle / "vision.ort-cpu.onnx", "../outside/vision.onnx.data")
    _rehash(bundle, "vision.ort-cpu.onnx")
    for verify in (True, False):  # confinement holds without hash checks too
        with pytest.raises(
            BundleError,
            match="vision graph vision.ort-cpu.onnx's external data location names '../outside/vision.onnx.data'",
        ):
            Bundle(bundle, verify=verify).graph_file("vision", "ort-cpu")
    _refused_by_masc_run(bundle, tmp_path, "external data location", "'../outside/vision.onnx.data'")


@pytest.mark.slow
def test_external_data_not_hashed_is_refused(bundle, tmp_path):
    """The graph reads ``extra.data`` (halved weights, inside the folder) while the manifest
    hashes ``vision.onnx.data``: the bytes the runtime would read are not checked, so refused."""
    _halved_weights(bundle / "vision.onnx.data", bundle / "extra.data")
    _relocate_external_data(bundle / "vision.ort-cpu.onnx", "extra.data")
    _rehash(bundle, "vision.ort-cpu.onnx")
    with pytest.raises(BundleError, match="extra.data is not listed in the manifest"):
        Bundle(bundle).graph_file("vision", "ort-cpu")
    _refused_by_masc_run(bundle, tmp_path, "extra.data is not listed in the manifest")


def test_external_data_modified_is_refused_even_when_the_manifest_omits_it(bundle, tmp_path):
    """A graph whose manifest entry lists no external data still has its weights hashed."""
    _halved_weights(bundle / "vision.onnx.data", bundle / "vision.onnx.data.new")
    os.replace(bundle / "vision.onnx.data.new", bundle / "vision.onnx.data")

    def change(m):
        for e in (m["graphs"]["vision"], m["graphs"]["vision"]["variants"]["ort-cpu"]):
            e.pop("external_data")

    _edit(bundle, change)
    with pytest.raises(BundleError, match=r"vision.onnx.data sha256 .* != manifest"):
        Bundle(bundle).graph_file("vision", "ort-cpu")


# ------------------------------------------------------------------ files that do not load


@pytest.mark.slow
def test_tokenizer_that_does_not_parse_is_one_line(bundle, tmp_path):
    (bundle / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    _rehash(bundle, "tokenizer.json")
    from masc_engine.runtime.scorer import Scorer

    with pytest.raises(BundleError, match="tokenizer .*tokenizer.json could not be parsed") as e:
        Scorer(bundle)
    assert "\n" not in str(e.value)
    _refused_by_masc_run(bundle, tmp_path, "tokenizer.json could not be parsed")


@pytest.mark.slow
def test_graph_onnxruntime_cannot_load_is_one_line(bundle, tmp_path):
    """A well-formed ONNX file, hash listed, with an operator ONNX Runtime does not have."""
    onnx = pytest.importorskip("onnx", reason="writing a graph needs onnx (export extra)")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["hidden"], ["pooled"], domain="masc.nowhere")],
        "g",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "n", 64])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["b", 64])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("masc.nowhere", 1)]
    )
    onnx.save(model, str(bundle / "pool.onnx"))
    _rehash(bundle, "pool.onnx")
    with pytest.raises(BundleError, match="onnxruntime could not load its pool graph") as e:
        Bundle(bundle).runner("pool")
    assert "\n" not in str(e.value)
    _refused_by_masc_run(bundle, tmp_path, "could not load its pool graph")


@pytest.mark.slow
def test_graph_that_is_not_onnx_is_one_line(bundle, tmp_path):
    (bundle / "pool.onnx").write_bytes(b"\xff" * 64)
    _rehash(bundle, "pool.onnx")
    with pytest.raises(BundleError, match="pool graph pool.onnx is not an ONNX graph"):
        Bundle(bundle).graph_file("pool")
    _refused_by_masc_run(bundle, tmp_path, "pool.onnx is not an ONNX graph")


# ------------------------------------------------------------------ numbers


def _set(m: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for k in path:
        m = m[int(k)] if isinstance(m, list) else m[k]
    m[int(last) if isinstance(m, list) else last] = value


BAD_NUMBERS = [
    ("image.max_num_patches", 10**7, "integer from 1 to 16384"),
    ("image.patch_size", 0, "integer from 1 to 256"),
    ("image.image_std", [0.5, 0.0, 0.5], "finite number above 0"),
    ("text.max_length", 0, "integer from 1 to 4096"),
    ("text.pad_token_id", -1, "integer from 0 to 2147483647"),
    ("graphs.vision.inputs.0.shape.1", 10**9, "integer from 1 to 1048576"),
    # Names outside the known sets: a KeyError at the first image (resample) or in the TensorRT
    # memory plan (dtype) otherwise.
    ("image.resample", "sinc", "one of 'nearest', 'bilinear'"),
    ("graphs.vision.inputs.0.dtype", "float128", "one of 'float32', 'float16'"),
]


@pytest.mark.parametrize("field,value,expect", BAD_NUMBERS, ids=[b[0] for b in BAD_NUMBERS])
@pytest.mark.slow
def test_manifest_numbers_are_range_checked_at_load(bundle, tmp_path, field, value, expect):
    """Refused by ``Bundle`` before any row (not a MemoryError or ZeroDivisionError at the first
    image); masc-run on rows whose images are missing (nothing to preprocess) still refuses."""
    _edit(bundle, lambda m: _set(m, field, value))
    shown = (
        field
        if not field.startswith("graphs.")
        else "graphs.vision.pixel_values." + ("dtype" if field.endswith("dtype") else "shape")
    )
    with pytest.raises(BundleError, match=rf"manifest {shown} is .*{expect}"):
        Bundle(bundle, verify=False)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(
        "ref_image,ref_mask,out_image,out_mask,prompt,object_name\n"
        "no/ref.png,no/ref_mask.png,no/out.png,no/out_mask.png,a photo of a dog,dog\n"
    )
    _refused_by_masc_run(bundle, tmp_path, f"manifest {shown} is ", expect, pairs=pairs)


def test_manifest_that_is_not_an_object_is_one_line(bundle):
    (bundle / "manifest.json").write_text("[1, 2]")
    with pytest.raises(BundleError, match="not a masc-bundle manifest"):
        Bundle(bundle)


BAD_SECTIONS = [  # each was a KeyError / AttributeError / TypeError traceback at load or first use
    (lambda m: m.pop("scoring"), "manifest has no scoring table"),
    (lambda m: m.pop("image"), "manifest has no image table"),
    (lambda m: m.pop("architecture"), "manifest has no architecture table"),
    (lambda m: m.update(precision="fp32"), "manifest precision is 'fp32', not a table"),
    (lambda m: m.update(variants="x"), "manifest variants is 'x', not a table"),
    (lambda m: m["graphs"]["vision"].update(inputs="x"), "manifest graphs.vision.inputs is 'x', not a list of tensor"),
    (lambda m: m["graphs"]["pool"].update(outputs=[1]), r"manifest graphs.pool.outputs is \[1\], not a list of tensor"),
    (lambda m: m["files"].update({"vision.onnx": None}), "manifest files.vision.onnx is None, not a sha256 digest"),
    (lambda m: m["files"].update({"pool.onnx": "abc"}), "manifest files.pool.onnx is 'abc', not a sha256 digest"),
]


@pytest.mark.parametrize(
    "change,expect",
    BAD_SECTIONS,
    ids=[b[1].split(" is")[0].split(" has")[0] + str(i) for i, b in enumerate(BAD_SECTIONS)],
)
def test_manifest_sections_of_the_wrong_type_are_one_line(bundle, change, expect):
    _edit(bundle, change)
    with pytest.raises(BundleError, match=rf"bundle {bundle}: {expect}.*re-export the bundle"):
        Bundle(bundle, verify=False)


# ------------------------------------------------------------------ the other commands


@pytest.mark.slow
def test_masc_rank_refuses_a_bad_bundle_in_one_line(bundle, tmp_path):
    _edit(bundle, lambda m: _set(m, "image.patch_size", 0))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.rank_cmd",
            "--oracle",
            "--gallery",
            str(EXAMPLES / "gallery.csv"),
            "--bundle",
            str(bundle),
            "--out",
            str(tmp_path / "r.csv"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    line = _one_error_line(proc)
    assert "manifest image.patch_size is 0" in line, line


@pytest.mark.slow
def test_masc_rank_refuses_a_tokenizer_outside_in_one_line(bundle, tmp_path):
    target = tmp_path / "outside" / "tokenizer.json"
    shutil.copy(bundle / "tokenizer.json", target)
    name = "../outside/tokenizer.json"

    def change(m):
        m["text"]["tokenizer_file"] = name
        m["files"][name] = _sha(target)

    _edit(bundle, change)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.rank_cmd",
            "--oracle",
            "--gallery",
            str(EXAMPLES / "gallery.csv"),
            "--bundle",
            str(bundle),
            "--out",
            str(tmp_path / "r.csv"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert "text.tokenizer_file names '../outside/tokenizer.json'" in _one_error_line(proc)


def test_masc_serve_reports_a_bad_bundle_as_one_load_failed_line(bundle):
    pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
    (bundle / "tokenizer.json").write_text("not json at all")
    _rehash(bundle, "tokenizer.json")
    from masc_engine.serve.state import ServeConfig, ServiceState

    state = ServiceState(ServeConfig(bundle=str(bundle)))
    try:
        state.load()
    finally:
        state.decode_pool.shutdown(wait=False)
    assert not state.ready
    assert state.load_error.startswith("BundleError: tokenizer ") and "could not be parsed" in state.load_error
    assert "\n" not in state.load_error


@pytest.mark.slow
def test_segmenter_bundle_files_are_confined_too(seg_bundle, bundle, tmp_path):
    """The segmenter bundle's decoder graph behind a symlink out of its folder: refused by the
    API and by masc-run --segmenter, in one line."""
    seg = tmp_path / "segmenter"
    shutil.copytree(seg_bundle, seg)
    shutil.move(seg / "decoder.onnx", tmp_path / "outside" / "decoder.onnx")
    (seg / "decoder.onnx").symlink_to(tmp_path / "outside" / "decoder.onnx")
    from masc_engine.runtime.segmenter import Segmenter

    with pytest.raises(BundleError, match="manifest graphs.decoder.file names 'decoder.onnx', which is a symlink"):
        Segmenter(seg)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(
        "ref_image,out_image,prompt,object_name\n"
        f"{EXAMPLES / 'images/backpack/00.jpg'},{EXAMPLES / 'images/backpack/01.jpg'},a backpack,backpack\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.run_cmd",
            str(pairs),
            "--bundle",
            str(bundle),
            "--segmenter",
            str(seg),
            "--out",
            str(tmp_path / "scores.csv"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert "graphs.decoder.file names 'decoder.onnx', which is a symlink" in _one_error_line(proc)


# ------------------------------------------------------------------ the wire reader


def test_wire_reader_field_numbers_match_onnx():
    onnx = pytest.importorskip("onnx", reason="onnx (export extra) holds the schema")
    from masc_engine.engine import onnx_wire as w

    d = {
        cls: cls.DESCRIPTOR.fields_by_name
        for cls in (
            onnx.ModelProto,
            onnx.GraphProto,
            onnx.NodeProto,
            onnx.AttributeProto,
            onnx.FunctionProto,
            onnx.SparseTensorProto,
            onnx.TensorProto,
            onnx.TrainingInfoProto,
        )
    }
    assert w._MODEL == {
        d[onnx.ModelProto][n].number: k
        for n, k in (("graph", "graph"), ("functions", "function"), ("training_info", "training"))
    }
    assert set(w._GRAPH) == {d[onnx.GraphProto][n].number for n in ("node", "initializer", "sparse_initializer")}
    assert set(w._ATTRIBUTE) == {
        d[onnx.AttributeProto][n].number for n in ("t", "g", "tensors", "graphs", "sparse_tensor", "sparse_tensors")
    }
    assert set(w._FUNCTION) == {d[onnx.FunctionProto][n].number for n in ("node", "attribute_proto")}
    assert set(w._SPARSE) == {d[onnx.SparseTensorProto][n].number for n in ("values", "indices")}
    assert set(w._TRAINING) == {d[onnx.TrainingInfoProto][n].number for n in ("initialization", "algorithm")}
    assert w._NODE == {d[onnx.NodeProto]["attribute"].number: "attribute"}
    assert w._TENSOR_EXTERNAL_DATA == d[onnx.TensorProto]["external_data"].number


def test_wire_reader_finds_every_location_onnx_finds(naflex_bundle, tmp_path):
    """The bundle's graphs, and a model whose external tensor sits in an ``If`` branch (a
    subgraph), read as onnx reads them."""
    onnx = pytest.importorskip("onnx", reason="onnx (export extra) is the reference")
    from onnx import TensorProto, helper
    from onnx.external_data_helper import _get_all_tensors

    from masc_engine.engine.onnx_wire import external_data_locations

    def onnx_locations(path):
        m = onnx.load(str(path), load_external_data=False)
        return sorted({e.value for t in _get_all_tensors(m) for e in t.external_data if e.key == "location"})

    for g in sorted(naflex_bundle.glob("*.onnx")):
        assert sorted(external_data_locations(g)) == onnx_locations(g), g.name
    assert external_data_locations(naflex_bundle / "vision.ort-cpu.onnx") == ["vision.onnx.data"]

    w = helper.make_tensor("w", TensorProto.FLOAT, [4], np.ones(4, np.float32).tobytes(), raw=True)
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    w.external_data.add(key="location", value="../branch.data")
    branch = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "then",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[w],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    main = helper.make_graph(
        [node],
        "main",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    path = tmp_path / "if.onnx"
    path.write_bytes(helper.make_model(main).SerializeToString())
    assert external_data_locations(path) == ["../branch.data"] and onnx_locations(path) == ["../branch.data"]


@pytest.mark.parametrize(
    "name,why",
    [("../../outside.engine", "'..' part"), ("/tmp/x.engine", "'..' part"), ("link.engine", "symlink leading out")],
)
def test_tensorrt_engine_files_stay_inside_the_bundle(tmp_path, name, why):
    """An engine set's ``engines.json`` names its engine files; each resolves inside the bundle
    (an absolute name joined to the engine folder keeps its ``..``-free form, and is refused as
    an empty part)."""
    from masc_engine.engine.backends import trt_profiles as tp

    folder = tmp_path / "bundle" / tp.engine_dir_name("fp16")
    folder.mkdir(parents=True)
    (tmp_path / "outside.engine").write_bytes(b"engine")
    (folder / "link.engine").symlink_to(tmp_path / "outside.engine")
    side = {"format": tp.SIDECAR_FORMAT, "format_version": tp.SIDECAR_VERSION, "engines": {"vision": {"file": name}}}
    (folder / tp.SIDECAR_NAME).write_text(json.dumps(side))
    with pytest.raises(BundleError, match=rf"engines\.vision\.file names .*{why}"):
        tp.read_sidecar(tmp_path / "bundle", "fp16")
    (folder / tp.SIDECAR_NAME).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        tp.read_sidecar(tmp_path / "bundle", "fp16")
