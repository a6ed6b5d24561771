"""Pure metric modules (arrays in, numbers out; no file I/O), the lowest layer above the shared
leaves: agreement statistics (:mod:`.agreement`: Krippendorff's alpha, Spearman's rho, bootstrap
CIs, ROC AUC), Spearman's rank correlation (:mod:`.ranked`: the one kernel), the
reduced-precision certification (:mod:`.certification`: bf16-cpu, FP8 and int8 gates) and
retrieval metrics (:mod:`.retrieval`: AP, CMC, ranking with ties)."""
