"""Every numeric tolerance of masc-engine, each with how it was measured.

Tests and the export validator import from here; no test hard-codes its own tolerance.
Measurements: CPU (2 cores, x86-64), torch 2.13.0+cpu, transformers 5.24.0, onnxruntime 1.32.0,
random-weight tiny SigLIP2 models (export/random_models.py), unless a line says otherwise.
"""

#: |Delta CP| and |Delta PF| against masc-metric 0.3.0 on the same weights (issue 2 acceptance).
#: Measured: see README "Fidelity" (max over the shared DreamBooth pairs and the grid suite).
ORACLE_SCORE_ATOL = 1e-5

#: pixel_values against transformers' PIL-backed Siglip2/Siglip image processor (issue 2).
#: Measured max |Delta| = 0 (same Pillow resize, same float64 rescale, same float32 normalize).
PIXEL_VALUES_ATOL = 1e-6

#: Mask downsample against torch.nn.functional.interpolate(bilinear, align_corners=False).
#: Measured max |Delta| = 1.8e-7 (1-2 float32 ulps) over the 158 shared masks x 10 grids and 300
#: random masks; 0 patches flip across the 0.5 threshold.
MASK_GRID_ATOL = 5e-7

#: Position-embedding resize matrix against Siglip2VisionEmbeddings.resize_positional_embeddings.
#: Measured max |Delta| = 2.4e-7 on unit-variance tables over the test grids.
POSITION_ATOL = 1e-6

#: Export validation (ONNX Runtime CPU vs PyTorch, fp32) on shapes other than the traced ones.
#: Absolute error on activations of unit scale (post-LayerNorm tokens, pooled embeddings).
#: Measured on the tiny models: max 3e-6 (vision), 1e-6 (pool), 2e-6 (text); the bound leaves
#: room for the deeper so400m/base shapes, whose error grows with depth (measured there: see
#: bench/results). A real export bug (wrong mask, wrong position resize) gives errors >= 1e-2.
EXPORT_VALIDATION_ATOL = 1e-3

#: Identical reference and output (image and mask) give CP = 1 up to float32 rounding of the
#: cosine of a vector with itself (issue 2 invariant).
SELF_CP_ATOL = 1e-6

#: Scores must not depend on batch composition or order. Different batch sizes change BLAS
#: reduction order in ONNX Runtime; measured max |Delta| 6e-8 on the tiny model.
BATCH_INVARIANCE_ATOL = 1e-6

#: The ``cp`` graph (export/cp_head.py) on ONNX Runtime CPU against the numpy head
#: (runtime/heads.py ``masked_maxcos``), float32, |Delta CP| per pair.
#: Measured max |Delta CP|: 1.8e-7 at so400m shapes (D = 1152, N = M = 1024 patches, 2 references
#: x 4 outputs, 6 draws of correlated tokens with CP around 0.91); 3.0e-7 over export/validate.py's
#: ``cp_validation_cases`` with seeds 0-11 at D = 64, 768, 1152 (padding, one reference x 5
#: outputs, a reference keeping nothing); real tiny-model tokens in tests/test_cp_head.py. The
#: differences are summation order (MLAS GEMM and ReduceSum vs numpy's BLAS and pairwise mean);
#: 1e-6 leaves 3x headroom.
CP_HEAD_ATOL = 1e-6

#: The same graph's per-reference-patch best cosine (output ``best``) against
#: ``heads.best_match_cosines``: one cosine each, so no averaging of rounding errors as in CP.
#: Measured max 8.9e-7 (D = 1152), 8.3e-7 (D = 768), 4.2e-7 (D = 64) over the same cases.
CP_BEST_ATOL = 2e-6

# Fidelity gates for reduced-precision bundles and engines (fp16 / bf16 graphs from
# export/precision.py, TensorRT) against fp32 on the same inputs: at export (export/validate.py,
# against PyTorch fp32) and at scale (bench/precision_fidelity.py, bench/fidelity_gates.py).
# ACCEPTANCE THRESHOLDS set by issues 3 and 9, not measurements; what was measured against them is
# in bench/results/precision_fidelity.json (README "Backends and support matrix").
#: Per-pair max |Delta CP| and |Delta PF|.
FIDELITY_MAX_ABS_DELTA = 2e-3
#: Spearman correlation of CP (and of PF) between the two precisions, over all pairs.
FIDELITY_MIN_SPEARMAN = 0.999
#: Cosine between the two precisions' pooled (background) embeddings, per image (also the text
#: tower's pooled embedding, per prompt, at export).
FIDELITY_MIN_EMBEDDING_COSINE = 0.9995
#: Patch-token cosine (reduced precision vs PyTorch fp32, real patches only) at export: the median
#: and the 0.1st percentile over the validation images' tokens (issue 9 acceptance thresholds).
REDUCED_TOKEN_COSINE_MEDIAN = 0.999
REDUCED_TOKEN_COSINE_P001 = 0.99
#: Pairs needed for the gates to count.
FIDELITY_MIN_PAIRS = 1000
