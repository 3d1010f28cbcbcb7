"""The gateway test harnesses, one family over one composition root (``gateway.ops.server``):

- ``tests.harness.memory.MemoryGateway``: the server over an in-memory bucket and a fake
  clock, called record by record with no socket (unit tests); ``TcpClient`` for the tests of
  the transport itself.
- ``tests.harness.thread.GatewayThread``: the same server on a loop thread of its own, over
  real stores, for blocking clients (libnfs, ``tests.rpcclient.BlockingRpcClient``).
- ``loadgen.gwprocess.GatewayProcess``: ``nfsgw serve`` as a child process (kill -9 and
  restart, signals, the kernel client), shared with the benchmarks and ``make demo``.

Around them: ``tests.harness.proxy.ThreadProxy`` (S3 faults and request counts),
``tests.harness.stores`` (``GatedStore``, ``SpyStore``), ``tests.harness.buckets`` (fresh
buckets; the ``make_bucket`` fixture). Which one to use when: tests/README.md.
"""
