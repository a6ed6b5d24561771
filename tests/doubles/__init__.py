"""Test doubles: stand-ins for what cannot run here, as unkind as the real thing where it matters.

- ``fake_tensorrt``: the ``tensorrt`` module (11.x surface, asynchronous streams, the parser's op
  list, builds that fail where the real builder fails) and ``NumpyDevice``;
- ``device``: CuPy's device-array rules on numpy (``DeviceArray``, ``StrictDeviceArray``,
  ``fake_xp``, ``StrictFakeDevice``);
- ``runners``: graph runners that count what ran (``CountingRunner``) or run a graph's arithmetic
  on an array module (``ArrayCPRunner``);
- ``exported_graphs``: masc-export's graph tracing replayed from an earlier export of the same
  checkpoint (``graphs_from``), for tests of what the export does around the tracing.
"""
