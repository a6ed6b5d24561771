"""Pure metric modules (arrays in, numbers out; no file I/O): agreement statistics
(:mod:`.agreement`: Krippendorff's alpha, Spearman's rho, bootstrap CIs, ROC AUC) and retrieval
metrics (:mod:`.retrieval`: AP, CMC, ranking with ties)."""
