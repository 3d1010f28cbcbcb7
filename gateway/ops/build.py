"""Startup: the parts of one gateway process, constructed inside-out from its configuration.

Owns: the order in which the parts are made and what each receives: every part gets the parts
it uses as constructor arguments (no attribute is set on a part after it is built), and every
part's counters are registered with the metrics next to its construction. Reading ``build``
top to bottom is reading the process's architecture (docs/architecture.md "Startup"):

    handle codec, memory tier, disk tier
      -> the "file opened" relay -> ObjectReader -> WriteManager -> DataPrefetcher
      -> per export (``ExportBuilder``): store -> PackedStore -> Namespace -> Export
      -> Gateway -> the dispatcher's procedures -> warm-ups -> FastPath

Must not: open listeners, probe backends or announce readiness (``gateway.ops.server``), or
import the server or the admin API.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.backend import open_store, parse_store_url
from gateway.backend.base import ObjectStore, RequestObserver
from gateway.backend.config import RetryPolicy
from gateway.clock import Clock
from gateway.data import DataCache, DataStats, DiskStats, ObjectReader, open_disk_tier
from gateway.data.events import FileOpened
from gateway.data.fleet import Fleet
from gateway.data.prefetch import DataPrefetcher, PrefetchStats
from gateway.data.shared import SharedLimits, SharedTier
from gateway.data.tiers import Piece
from gateway.dispatch import Dispatcher
from gateway.exports import Export, ExportConfig, export_id_for
from gateway.fastpath import FastPath
from gateway.handlers import register_all
from gateway.namespace import NO_WATCHER, DirWatcher, Namespace, NamespaceStats
from gateway.namespace.handles import load_or_create_secret
from gateway.namespace.legacymap import LegacyMap
from gateway.namespace.resolve import Handles
from gateway.ops.config import ServerConfig
from gateway.ops.metrics import Metrics
from gateway.ops.warmup import Warmups
from gateway.ops.workers import WorkerRole
from gateway.pack.store import PackConfig, PackedStore, PackStats
from gateway.pack.tiers import ReaderTiers
from gateway.registry import Gateway
from gateway.writes import WriteManager

log = structlog.get_logger(__name__)

StoreFactory = Callable[[ExportConfig, RequestObserver], ObjectStore]
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


@dataclass(frozen=True, slots=True)
class Parts:
    """What ``build`` made; the server keeps them for its life cycle (listeners, reload,
    shutdown)."""

    gateway: Gateway
    reader: ObjectReader
    writes: WriteManager
    prefetcher: DataPrefetcher | None
    warmups: Warmups
    fastpath: FastPath | None
    exports: ExportBuilder
    shared: SharedTier | None  # the reader's too; the server probes and closes it


@dataclass(frozen=True, slots=True)
class ExportBuilder:
    """One export from its settings, at start and for every export a reload adds or rebuilds:
    its store (``open_store``, or the tests' ``store_factory``), the pack serving its packed
    objects, its index (which tells the data prefetcher what it listed) and the ``Export``."""

    clock: Clock
    metrics: Metrics
    reader: ObjectReader
    writes: WriteManager
    prefetcher: DataPrefetcher | None
    pack_config: PackConfig
    store_factory: StoreFactory | None
    spawn: Spawn
    shared: SharedTier | None = None  # the fleet's shared tier: packs' groups go there too
    origins: dict[str, str] = dataclasses.field(default_factory=dict)
    """Each export store's name -> its origin identity (endpoint and bucket): the shared
    tier's keys (``gateway.data.shared``), the same on every gateway of a fleet."""

    def build(self, ec: ExportConfig, config: ServerConfig) -> Export:
        store = self._store(ec, config)
        prefix = parse_store_url(ec.backend).prefix
        if ec.pack is not None:
            store = self._packed(ec, config, store, prefix)
        export_id = export_id_for(ec.path)
        ns_stats = NamespaceStats()
        self.metrics.add_stats("namespace", ns_stats)
        ns = Namespace(
            store,
            prefix,
            clock=self.clock,
            config=config.cache.namespace_for(ec, len(config.exports)),
            stats=ns_stats,
            watcher=self._watcher(ec, export_id, store, prefix),
        )
        return Export(export_id, ec, store, ns, prefix)

    def _store(self, ec: ExportConfig, config: ServerConfig) -> ObjectStore:
        observer = self.metrics.backend_request
        if self.store_factory is not None:
            store = self.store_factory(ec, observer)
        else:
            store = open_store(ec.backend, s3=config.s3, observer=observer)
        self.origins[store.name] = f"{store.traits.endpoint}|{store.name}"
        return store

    def _packed(
        self, ec: ExportConfig, config: ServerConfig, inner: ObjectStore, prefix: str
    ) -> PackedStore:
        """The export's store answering packed objects from ``ec.pack``; its index loads in
        the background (listings of an immutable export wait for it, up to
        ``PackConfig.index_wait_s``; GETs meanwhile, and everything if it is bad, come from
        the bucket). Neighbours of a member go to the reader's tiers (``ReaderTiers``)."""
        assert ec.pack is not None
        packs = self._store(dataclasses.replace(ec, backend=ec.pack), config)
        stats = PackStats()
        self.metrics.add_stats("pack", stats)
        store = PackedStore(
            inner,
            packs,
            parse_store_url(ec.pack).prefix,
            prefix,
            ec.pack,
            ec.backend,
            small_file_max=config.cache.reads.small_file_max,
            list_from_index=ec.immutable,
            config=self.pack_config,
            stats=stats,
            tiers=ReaderTiers(self.reader, inner.name),
            fleet=self.shared,
        )
        self.spawn(store.load(), f"pack-load:{ec.path}")
        return store

    def _watcher(
        self, ec: ExportConfig, export_id: int, store: ObjectStore, prefix: str
    ) -> DirWatcher:
        """The data prefetcher's view of this export's listings, or none: prefetch off, off
        for this export, or a store with no latency to hide (a local directory's files cost
        a READ what they would cost a prefetch: prefetching them only takes CPU from READs)."""
        p = self.prefetcher
        if p is None or not ec.data_prefetch or not store.traits.latency_to_hide:
            return NO_WATCHER
        return p.watch(self._leave_alone(ec, export_id, store, prefix))

    def _leave_alone(
        self, ec: ExportConfig, export_id: int, store: ObjectStore, prefix: str
    ) -> Callable[[str], bool] | None:
        """What the data prefetcher must not fetch now: on a read-write export, a key with
        writes staged; on a packed one, a member whose group is already being fetched."""
        covered = store.covered if isinstance(store, PackedStore) else None
        if ec.read_only:
            return covered
        writes = self.writes
        n = len(prefix)

        def leave(key: str) -> bool:
            return writes.staged_id(export_id, key[n:]) is not None or (
                covered is not None and covered(key)
            )

        return leave


async def build(
    config: ServerConfig,
    *,
    clock: Clock,
    metrics: Metrics,
    dispatcher: Dispatcher,
    role: WorkerRole | None,
    store_factory: StoreFactory | None,
    pack_config: PackConfig,
    prefetch_stats: PrefetchStats,
    spawn: Spawn,
) -> Parts:
    """Construct the parts of a gateway process for ``config`` (see the module docstring);
    the exports' stores connect on first use, nothing listens yet. ``clock`` drives what
    expires (the index's TTLs; a fake one in tests); the disk tier, the data prefetcher and
    the write-back of staged files keep their default, the system clock, because what they
    time they also wait for on the event loop (claim polls, back-off pauses, idle flushes)."""
    c = config
    state_dir = c.server.state_dir
    await asyncio.to_thread(state_dir.mkdir, parents=True, exist_ok=True)
    secret = load_or_create_secret(state_dir)
    handles = Handles(secret, legacy=LegacyMap.open_if_present(state_dir))
    metrics.add_stats("handles", handles.stats)

    # cache.memory is the service's budget: with workers, each one's memory tier a share, in
    # which a mapping of the shared disk tier's entry costs its share of the pages.
    workers = role.count if role is not None else 1
    data_stats = DataStats()
    metrics.add_stats("data", data_stats)
    cache = DataCache(c.cache.memory // workers, stats=data_stats, shared_by=workers)
    disk_stats = DiskStats()  # the host's one data cache, shared by the workers
    metrics.add_stats("disk", disk_stats)
    disk = await open_disk_tier(
        c.server.cache_dir,
        state_dir,
        c.cache.data.disk,
        disk_stats,
        shared=workers > 1,
    )
    if disk is None and workers > 1:
        log.error(
            "shared_cache_unavailable",
            worker=role.index if role is not None else 0,
            consequence="this worker fetches and holds files of its own",
        )

    origins: dict[str, str] = {}  # filled by ExportBuilder, read by the shared tier
    shared = _shared_tier(c, origins, role, metrics)
    opened = FileOpened()  # the reader says which files READs open; the prefetcher listens
    reader = ObjectReader(cache, c.cache.reads, data_stats, disk, opened=opened, shared=shared)

    # A relative spool_dir (the default "spool") is under the state directory. Workers other
    # than the owner never stage writes (calls for read-write exports are routed to the
    # owner, ``gateway.forward``); they get a directory of their own all the same, so nothing
    # they do at start can touch the owner's spool.
    spool_dir = state_dir / c.writes.spool_dir
    if role is not None and not role.owner:
        spool_dir = spool_dir / f"worker-{role.index}"
    writes = WriteManager(dataclasses.replace(c.writes, spool_dir=spool_dir), reader)
    metrics.add_stats("writes", writes.stats)

    metrics.add_stats("prefetch", prefetch_stats)
    prefetcher = _prefetcher(
        c, reader, opened, disk is not None, role, metrics, prefetch_stats, shared
    )

    exports = ExportBuilder(
        clock=clock,
        metrics=metrics,
        reader=reader,
        writes=writes,
        prefetcher=prefetcher,
        pack_config=pack_config,
        store_factory=store_factory,
        spawn=spawn,
        shared=shared,
        origins=origins,
    )
    gw = Gateway(c.server.nfs, handles, reader, writes)
    metrics.add_stats("gateway", gw.stats)
    for ec in c.exports:
        gw.add_export(exports.build(ec, c))
    register_all(dispatcher, gw)
    metrics.prepare()

    warmups = Warmups(gw, clock)
    metrics.add_stats("warmup", warmups.stats)
    fast: FastPath | None = None
    if c.server.fast_path:
        # A worker that is not the owner answers only read-only exports' calls itself.
        fast = FastPath(gw, metrics.call, local_only=role is not None and not role.owner)
        metrics.add_stats("fast", fast.stats)
    return Parts(gw, reader, writes, prefetcher, warmups, fast, exports, shared)


def _shared_tier(
    c: ServerConfig, origins: dict[str, str], role: WorkerRole | None, metrics: Metrics
) -> SharedTier | None:
    """The fleet's shared tier (``gateway.data.shared``) when ``[cache] shared`` names a
    bucket, reached with its own endpoint, region and credentials (the AWS chain unless
    ``shared_profile``); its requests fail fast (two attempts): a slow shared tier is a
    miss, served from the origin. Its bodies are not signed (their checksums protect them).
    Who owns what: the fleet (``[fleet]``), else everyone."""
    sc = c.cache.data.shared
    if sc.url is None:
        return None
    store = open_store(
        sc.url,
        endpoint_url=sc.endpoint_url,
        region=sc.region,
        profile=sc.profile,
        retry=RetryPolicy(max_attempts=2, deadline_s=sc.timeout_s),
        # A fill carries a CRC32 the store checks and a CRC64NVME every reader checks: a
        # SHA-256 of the payload (signed over plain HTTP) would only add ~0.3 ms per 110 kB.
        payload_signing="never",
    )
    fleet = _fleet(c, role)
    limits = SharedLimits(
        max_piece=sc.max_piece,
        max_inflight_puts=sc.max_inflight_puts,
        max_inflight_bytes=sc.max_inflight_bytes,
        breaker_cooldown_s=sc.retry_after_s,
        timeout_s=sc.timeout_s,
    )
    tier = SharedTier(
        store, parse_store_url(sc.url).prefix, origins=origins, limits=limits, fleet=fleet
    )
    metrics.add_stats("shared", tier.read_stats)
    return tier


def _fleet(c: ServerConfig, role: WorkerRole | None) -> Fleet | None:
    """The fleet's members as ``[fleet]`` names them (None: no fleet, so this gateway owns
    every object it reads)."""
    fc = c.fleet
    if not fc.enabled:
        return None
    me = fc.self_ or f"{c.server.listen}:{c.server.port}"
    fleet = Fleet(me, fc.members, dns=fc.members_dns, resolve_every_s=fc.resolve_every_s)
    if fc.members and fleet.self_ not in {Fleet(m).self_ for m in fc.members}:
        log.warning(
            "fleet_self_not_a_member",
            self=fleet.self_,
            members=list(fc.members),
            fix="set [fleet] self (--fleet-self) to this gateway's entry in members",
        )
    return fleet


def _prefetcher(
    c: ServerConfig,
    reader: ObjectReader,
    opened: FileOpened,
    disk: bool,
    role: WorkerRole | None,
    metrics: Metrics,
    stats: PrefetchStats,
    shared: SharedTier | None,
) -> DataPrefetcher | None:
    """The data prefetcher (``gateway.data.prefetch``), or None when it is off. It fills the
    memory tier (and the disk tier once memory is full); with several workers each one
    prefetches, its fetches claimed among them on the shared disk tier, so without one it
    stays off."""
    cfg = c.cache.data.prefetch
    if not cfg.enabled or not c.cache.coalesce:
        return None
    if role is not None and role.count > 1 and not disk:
        log.warning(
            "data_prefetch_off",
            reason="several workers and no shared disk tier: prefetched data would land in "
            "one worker's memory",
        )
        return None
    return DataPrefetcher(
        reader,
        cfg,
        pressure=lambda: metrics.backend_retries,
        stats=stats,
        share=(role.index, role.count) if role is not None else (0, 1),
        opened=opened,
        owns=_owner_test(shared),
        backlog=shared.backlogged if shared is not None else None,
    )


def _owner_test(shared: SharedTier | None) -> Callable[[str, str, str], bool] | None:
    """With a fleet: (store, key, ETag) -> whether this gateway fetches the object for the
    fleet (the data prefetcher walks those first)."""
    fleet = shared.fleet if shared is not None else None
    if fleet is None or (len(fleet.members) < 2 and fleet.dns is None):
        return None
    return lambda store, key, etag: fleet.owns(Piece(store, key, etag, 0, 0))
