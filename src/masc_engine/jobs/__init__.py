"""The job layer shared by every command (masc-run, masc-rank, masc-eval, masc-report) and the
service: one table reader (:mod:`.tables`), threaded loading (:mod:`.loading`), the journal and
result files (:mod:`.results`), executors behind one interface (:mod:`.executors`: local, Ray),
and the jobs themselves: pairs (:mod:`.pairs`, masc-run; :mod:`.items`, inputs decoded and
reduced to what scoring needs; :meth:`.pairs.PairsJob.decode_pair` and
:meth:`.pairs.PairsJob.score_decoded` for in-memory items, the service's path;
:meth:`.pairs.PairsJob.score_item` for one), FP-Rank (:mod:`.rank`, :mod:`.rank_encoders`) and the int8 gate
(:mod:`.int8_gate`). The encoding cache (memory LRU + disk store) is
:class:`masc_engine.runtime.cache.EncodingCache`.

Dependencies point down only: jobs import runtime, engine and metrics, and one job imports
export: :mod:`.int8_gate` imports ``export.int8`` (the quantizer) and ``export.stages`` at module
level. This package's ``__init__`` imports none of its modules, so loading another job does not
load the exporter, and the commands import the int8 gate inside the function that runs it.
Nothing below imports a job (tests/test_layers.py).
"""
