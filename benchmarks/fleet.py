"""A fleet of gateways (issue 35): three gateways sharing one shared tier, cold, one after
another, all at once, with a gateway killed and with the shared tier gone mid-epoch.

    .venv/bin/python benchmarks/fleet.py [--files 10000] [--size 110000] [--latency-ms 20]
        [--shared-latency-ms 1] [--clients 4] [--scenario 1,2,3,4] [--timeout 1800]
        [--out DIR]

Set-up: two throw-away SeaweedFS instances (``loadgen.seaweed``, each its own data directory
and ports). The origin holds a deterministic ImageNet-like tree (``data_prefetch.upload_tree``:
``--files`` files in folders of 100, lognormal sizes of mean ``--size`` and sd a quarter of it,
seed 0, also written to a local copy on /dev/shm that the C reader checks every byte against)
and is reached through a delay proxy (``data_prefetch.ProxyProcess``: ``nfsgw-loadgen proxy``
in its own process) adding ``--latency-ms`` to every request and counting requests by kind
(object GETs are kind ``GET``; listings are ``LIST``; the proxy does not count per key). The
shared tier is a bucket of the second SeaweedFS, fresh for each scenario, behind a proxy of its
own adding ``--shared-latency-ms``. Each scenario starts three fresh ``nfsgw serve`` processes
(``loadgen.gwprocess``: separate state directories, hence separate empty disk tiers, ports on
127.0.0.1, one worker process each, the default cache otherwise; the export read-only and
immutable as in ``data_prefetch.py``) with ``--shared-cache s3://BUCKET/fleet/``, its endpoint
and region, the three as ``--fleet-member`` and each as ``--fleet-self``; the shared tier's
credentials come from the AWS chain (the environment: both SeaweedFS instances have the same
identity).

Client, per gateway: the ImageFolder-like scan from a Python libnfs connection (list the root,
then every class folder), then a cold epoch read by ``--clients`` connections of the C reader
(``benchmarks/nfsread.c``), in a random order of its own per gateway (seed ``--seed`` + its
index): ``data_prefetch.CReaders``.

Scenarios:

1. **sequential**: gateway 1 reads the tree, then 2, then 3 (each waits until the one before
   has nothing in flight, its shared-tier fills included). Per gateway: epoch files/s (and with
   the scan), the origin and shared proxies' GET (and PUT) deltas, the gateway's CPU (its
   process tree from /proc, ``data_prefetch.cpu_seconds``, from before the scan until it is
   quiet) per file. Targets: origin GETs per object over the fleet <= 1.00; gateways 2 and 3
   >= 3x gateway 1's files/s; CPU per file of gateway 2 and 3 (shared-tier hits) <= 1.0x
   gateway 1's (origin GETs plus fills).
2. **concurrent**: the three read at the same time. Target: origin GETs per object <= 1.05;
   ``nfsgw_shared_cache_foreign_fetches_total`` summed over the gateways reported.
3. **killed**: as 2, and gateway 1 gets SIGKILL (its reader is stopped with it) once it has
   loaded half the objects (its origin GETs plus shared-tier hits, from /metrics). Targets:
   the other two read every byte right; origin GETs per object (all three's) <= 1.10.
4. **shared tier gone**: as 2, and the shared tier's proxy gets SIGKILL once the fleet has
   loaded half of what it loads (3 x files). Targets: every read byte-exact;
   ``nfsgw_shared_cache_breaker_open`` == 1 on every gateway; each gateway's origin GETs after
   the stop (``nfsgw_data_gets_total``) <= the objects it had not loaded at the stop (its
   "remaining" objects), and over the fleet at the origin proxy.

Results: a table on stdout and ``DIR/results.json`` (default /var/tmp/nfsgw-fleet), the logs
beside it. The machine is shared and noisy: compare the ratios of one run.

Must not: import the gateway (it runs ``nfsgw serve`` through ``loadgen.gwprocess``) or leave
a process running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
from _common import metric, results_dir, settle, write_results
from data_prefetch import (
    PREFIX,
    Account,
    CReaders,
    EpochRead,
    ProxyProcess,
    cpu_seconds,
    git_state,
    local_copy,
    log,
    upload_tree,
)

from loadgen.dataset import Manifest
from loadgen.gwmetrics import Samples
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer

OUT = results_dir("fleet")
ORIGIN_BUCKET = "fleet-origin"
SHARED_PREFIX = "fleet/"
GATEWAYS = 3
SCENARIOS = {"1": "sequential", "2": "concurrent", "3": "killed", "4": "shared-gone"}


@dataclass(slots=True)
class GwResult:
    """One gateway's part of a scenario."""

    name: str
    files: int = 0
    errors: int = 0
    scan_s: float = 0.0
    epoch_s: float = 0.0
    files_per_s: float = 0.0
    files_per_s_with_scan: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_s: float = 0.0
    cpu_ms_per_file: float = 0.0
    origin_gets: int = 0  # its own count (nfsgw_data_gets_total)
    proxy_origin_gets: int | None = None  # at the origin proxy (sequential only)
    proxy_shared_gets: int | None = None
    proxy_shared_puts: int | None = None
    shared_hits: int = 0
    shared_misses: int = 0
    fills: int = 0
    foreign_fetches: int = 0
    shared_errors: int = 0
    fills_skipped: int = 0
    skipped_by: dict[str, int] = field(default_factory=dict)  # fills skipped, by reason
    # The mean origin GET as the gateway saw it (nfsgw_s3_request_duration_seconds: the
    # shared tier's requests are not in it).
    origin_get_ms: float = 0.0
    breaker_open: float = 0.0
    killed: bool = False
    failure: str = ""


@dataclass(slots=True)
class Scenario:
    name: str
    gateways: list[GwResult] = field(default_factory=list)
    fleet: dict[str, float] = field(default_factory=dict)
    targets: dict[str, dict[str, object]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def target(s: Scenario, name: str, value: float, limit: float, op: str) -> None:
    ok = value <= limit if op == "<=" else value >= limit if op == ">=" else value == limit
    s.targets[name] = {"value": round(value, 4), "target": f"{op} {limit:g}", "met": ok}


def d(m: Samples, m0: Samples, name: str) -> int:
    return round(metric(m, name) - metric(m0, name))


def labelled(m: Samples, prefix: str) -> float:
    """The sum of every labelled sample of ``prefix`` (``name{...}``)."""
    return sum(v for k, v in m.items() if k.startswith(prefix + "{"))


@dataclass(frozen=True, slots=True)
class Stop:
    """The moment of a kill: the gateways' metrics (the victim's alone in scenario 3) and the
    origin proxy's counts."""

    metrics: list[Samples]
    origin: dict[str, int]
    # Scenario 4: the origin proxy's counts again after the gateways' scrapes; GETs that
    # arrived between the two cannot be put before or after the gateways' counts.
    origin_after_scrape: dict[str, int] = field(default_factory=dict)


class Fleet:
    """Three gateways over the origin proxy, sharing ``bucket`` behind ``shared``."""

    def __init__(
        self,
        work: Path,
        tag: str,
        origin: ProxyProcess,
        shared: ProxyProcess,
        bucket: str,
        sw: SeaweedServer,
        region: str,
        cache: dict[str, object],
    ) -> None:
        env = {k: v for k, v in os.environ.items() if k != "CACHE_DIRECTORY"}
        export = {
            "path": "/data",
            "backend": f"s3://{ORIGIN_BUCKET}/{PREFIX}",
            "read_only": True,
            "immutable": True,
            "insecure": True,
        }
        self.gws = [
            GatewayProcess(
                work,
                [export],
                name=f"{tag}-gw{i + 1}",
                sections={"cache": cache} if cache else None,
                s3=Account(origin.endpoint_url, sw.access_key, sw.secret_key),
                env=env,
            )
            for i in range(GATEWAYS)
        ]
        members = [f"127.0.0.1:{g.port}" for g in self.gws]
        for g, me in zip(self.gws, members, strict=True):
            g.flags += [
                "--shared-cache",
                f"s3://{bucket}/{SHARED_PREFIX}",
                "--shared-cache-endpoint-url",
                shared.endpoint_url,
                "--shared-cache-region",
                region,
                "--fleet-self",
                me,
            ]
            for m in members:
                g.flags += ["--fleet-member", m]

    def start(self) -> None:
        for g in self.gws:
            g.start()

    def stop(self) -> None:
        for g in self.gws:
            g.stop()


def quiet(gw: GatewayProcess, timeout_s: float = 60.0) -> None:
    """``settle`` (no GET nor prefetch in flight), then no shared-tier fill in flight."""
    settle(gw, timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric(gw.metrics(), "nfsgw_shared_cache_inflight_puts") == 0:
            return
        time.sleep(0.2)


def loaded(m: Samples) -> float:
    """Objects a gateway has (or is getting): its origin GETs plus its shared-tier hits."""
    return metric(m, "nfsgw_data_gets_total") + metric(m, "nfsgw_shared_cache_hits_total")


def fill(r: GwResult, m: Samples, m0: Samples) -> None:
    r.origin_gets = d(m, m0, "nfsgw_data_gets_total")
    r.shared_hits = d(m, m0, "nfsgw_shared_cache_hits_total")
    r.shared_misses = d(m, m0, "nfsgw_shared_cache_misses_total")
    r.fills = d(m, m0, "nfsgw_shared_cache_fills_total")
    r.foreign_fetches = d(m, m0, "nfsgw_shared_cache_foreign_fetches_total")
    r.shared_errors = d(m, m0, "nfsgw_shared_cache_errors_total")
    r.fills_skipped = round(
        labelled(m, "nfsgw_shared_cache_fills_skipped_total")
        - labelled(m0, "nfsgw_shared_cache_fills_skipped_total")
    )
    r.breaker_open = metric(m, "nfsgw_shared_cache_breaker_open")
    pre = "nfsgw_shared_cache_fills_skipped_total{"
    r.skipped_by = {
        k[len(pre) :].rstrip("}").partition("=")[2].strip('"'): round(v - m0.get(k, 0.0))
        for k, v in m.items()
        if k.startswith(pre) and round(v - m0.get(k, 0.0))
    }
    r.origin_get_ms = mean_ms(m, m0, "op=get")


def mean_ms(m: Samples, m0: Samples, op: str) -> float:
    """The mean backend request duration of ``op`` between two scrapes, ms."""
    total = count = 0.0
    for k, v in m.items():
        if op in k.lower():
            if k.startswith("nfsgw_s3_request_duration_seconds_sum"):
                total += v - m0.get(k, 0.0)
            elif k.startswith("nfsgw_s3_request_duration_seconds_count"):
                count += v - m0.get(k, 0.0)
    return round(total / count * 1e3, 2) if count else 0.0


def read_result(r: GwResult, scan_s: float, e: EpochRead) -> None:
    r.files, r.errors, r.scan_s, r.epoch_s = e.files, e.errors, round(scan_s, 3), e.seconds
    r.files_per_s = round(e.files / e.seconds, 1) if e.seconds else 0.0
    r.files_per_s_with_scan = round(e.files / (e.seconds + scan_s), 1) if e.seconds else 0.0
    r.p50_ms, r.p99_ms = round(e.p50_ms, 2), round(e.p99_ms, 2)


def run_readers(
    readers: Sequence[CReaders | None],
    manifest: Manifest,
    orders: Sequence[Sequence[int]],
    deadline: float,
    monitor: Callable[[], None] | None = None,
) -> list[tuple[float, EpochRead] | str]:
    """Each gateway's scan then epoch, all at once, one thread each; per gateway (scan
    seconds, the epoch) or why it failed. ``monitor`` is called every 0.1 s meanwhile. Past
    ``deadline`` (monotonic) every reader is killed and RuntimeError raised."""
    out: list[tuple[float, EpochRead] | str] = ["not run"] * len(readers)

    def job(i: int, rd: CReaders) -> None:
        try:
            s = rd.scan(manifest)
            out[i] = (s, rd.epoch(manifest, orders[i]))
        except Exception as e:  # a killed gateway's reader
            out[i] = f"{type(e).__name__}: {e}"

    threads = [
        threading.Thread(target=job, args=(i, rd), daemon=True)
        for i, rd in enumerate(readers)
        if rd is not None
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if time.monotonic() > deadline:
            for rd in readers:
                if rd is not None:
                    rd.reader.proc.kill()
            for t in threads:
                t.join(30)
            raise RuntimeError("the readers ran past --timeout")
        if monitor is not None:
            monitor()
        time.sleep(0.1)
    return out


class Bench:
    def __init__(self, a: argparse.Namespace, work: Path, tree: Path) -> None:
        self.a = a
        self.work = work
        self.tree = tree
        self.manifest: Manifest | None = None
        self.origin_sw: SeaweedServer | None = None
        self.shared_sw: SeaweedServer | None = None
        self.origin: ProxyProcess | None = None

    # -- set-up ---------------------------------------------------------------------------

    def setup(self) -> None:
        a = self.a
        self.origin_sw = SeaweedServer(data_dir=self.work / "origin-weed").start()
        self.shared_sw = SeaweedServer(data_dir=self.work / "shared-weed").start()
        self.manifest = upload_tree(
            self.origin_sw, ORIGIN_BUCKET, a.files, a.size, self.work, self.tree
        )
        self.origin = ProxyProcess(
            self.origin_sw.endpoint_url, a.latency_ms, a.out / "origin-proxy.log"
        )
        log(f"origin proxy {self.origin.endpoint_url}, +{a.latency_ms:g} ms")

    def teardown(self) -> None:
        if self.origin is not None:
            self.origin.stop()
        for sw in (self.origin_sw, self.shared_sw):
            if sw is not None:
                sw.stop()

    def orders(self) -> list[list[int]]:
        assert self.manifest is not None
        out = []
        for i in range(GATEWAYS):
            order = list(range(len(self.manifest.entries)))
            random.Random(self.a.seed + i).shuffle(order)
            out.append(order)
        return out

    # -- one scenario ---------------------------------------------------------------------

    def scenario(self, key: str) -> Scenario:
        a = self.a
        assert self.shared_sw is not None and self.origin is not None
        name = SCENARIOS[key]
        bucket = f"fleet-shared-{key}"
        self.shared_sw.create_bucket(bucket)
        shared = ProxyProcess(
            self.shared_sw.endpoint_url, a.shared_latency_ms, a.out / f"shared-proxy-{key}.log"
        )
        fleet = Fleet(
            self.work,
            f"s{key}",
            self.origin,
            shared,
            bucket,
            self.shared_sw,
            self.shared_sw.region,
            {}
            if a.shared_max_inflight_puts is None
            else {"shared_max_inflight_puts": a.shared_max_inflight_puts},
        )
        readers: list[CReaders | None] = []
        try:
            fleet.start()
            log(
                f"scenario {key} ({name}): gateways on ports "
                f"{', '.join(str(g.port) for g in fleet.gws)}, shared tier s3://{bucket}/ via "
                f"{shared.endpoint_url} (+{a.shared_latency_ms:g} ms)"
            )
            for g in fleet.gws:
                readers.append(CReaders(g.libnfs_url("/data"), self.tree, a.clients))
            if key == "1":
                return self.sequential(fleet, readers, shared)
            return self.together(key, fleet, readers, shared)
        finally:
            for rd in readers:
                if rd is not None:
                    rd.close()
            fleet.stop()
            shared.stop()

    def sequential(
        self, fleet: Fleet, readers: list[CReaders | None], shared: ProxyProcess
    ) -> Scenario:
        assert self.manifest is not None and self.origin is not None
        s = Scenario("sequential")
        n = len(self.manifest.entries)
        orders = self.orders()
        o0, s0 = self.origin.counts(), shared.counts()
        deadline = time.monotonic() + self.a.timeout
        for i, gw in enumerate(fleet.gws):
            r = GwResult(gw.name)
            m0, po, ps = gw.metrics(), self.origin.counts(), shared.counts()
            cpu0 = cpu_seconds(gw.pid)
            only: list[CReaders | None] = [None] * GATEWAYS
            only[i] = readers[i]
            got = run_readers(only, self.manifest, [orders[i]] * GATEWAYS, deadline)[i]
            quiet(gw)
            r.cpu_s = round(cpu_seconds(gw.pid) - cpu0, 2)
            m, po1, ps1 = gw.metrics(), self.origin.counts(), shared.counts()
            if isinstance(got, str):
                r.failure = got
            else:
                read_result(r, *got)
            r.cpu_ms_per_file = round(r.cpu_s / r.files * 1e3, 3) if r.files else 0.0
            fill(r, m, m0)
            r.proxy_origin_gets = po1.get("GET", 0) - po.get("GET", 0)
            r.proxy_shared_gets = ps1.get("GET", 0) - ps.get("GET", 0)
            r.proxy_shared_puts = ps1.get("PUT", 0) - ps.get("PUT", 0)
            s.gateways.append(r)
            log(f"  {describe(r)}")
        o1, s1 = self.origin.counts(), shared.counts()
        gets = o1.get("GET", 0) - o0.get("GET", 0)
        s.fleet = {
            "objects": n,
            "origin_gets": gets,
            "origin_lists": o1.get("LIST", 0) - o0.get("LIST", 0),
            "origin_gets_per_object": round(gets / n, 4),
            "shared_gets": s1.get("GET", 0) - s0.get("GET", 0),
            "shared_puts": s1.get("PUT", 0) - s0.get("PUT", 0),
            "foreign_fetches": sum(r.foreign_fetches for r in s.gateways),
            "fills_skipped": sum(r.fills_skipped for r in s.gateways),
            "errors": sum(r.errors for r in s.gateways),
        }
        g1, rest = s.gateways[0], s.gateways[1:]
        target(s, "origin GETs per object", gets / n, 1.00, "<=")
        for r in rest:
            ratio = r.files_per_s / g1.files_per_s if g1.files_per_s else 0.0
            target(s, f"{r.name} files/s / gw1's", ratio, 3.0, ">=")
        for r in rest:
            ratio = r.cpu_ms_per_file / g1.cpu_ms_per_file if g1.cpu_ms_per_file else 0.0
            target(s, f"{r.name} CPU per file / gw1's", ratio, 1.0, "<=")
        target(s, "wrong or unread files", s.fleet["errors"], 0, "==")
        return s

    def together(
        self, key: str, fleet: Fleet, readers: list[CReaders | None], shared: ProxyProcess
    ) -> Scenario:
        """Scenarios 2-4: the three at once (3: gateway 1 killed; 4: the shared tier)."""
        assert self.manifest is not None and self.origin is not None
        s = Scenario(SCENARIOS[key])
        n = len(self.manifest.entries)
        gws = fleet.gws
        m0 = [g.metrics() for g in gws]
        o0, s0 = self.origin.counts(), shared.counts()
        cpu0 = [cpu_seconds(g.pid) for g in gws]
        at: list[Stop] = []  # the moment of the kill

        def kill_gateway() -> None:
            if at:
                return
            m = gws[0].metrics()
            if loaded(m) - loaded(m0[0]) < n / 2:
                return
            gws[0].kill()
            rd = readers[0]
            if rd is not None:
                rd.reader.proc.kill()
            assert self.origin is not None
            at.append(Stop([m], self.origin.counts()))
            log(
                f"  SIGKILL {gws[0].name}: it had loaded {loaded(m) - loaded(m0[0]):.0f} "
                f"objects, its readers read {metric(m, 'nfsgw_prefetch_pass_read_files'):.0f}"
            )

        def kill_shared() -> None:
            if at:
                return
            assert self.origin is not None
            origin = self.origin.counts()  # before the gateways' counts: none counted twice
            ms = [g.metrics() for g in gws]
            done = [loaded(m) - loaded(b) for m, b in zip(ms, m0, strict=True)]
            if sum(done) < GATEWAYS * n / 2:
                return
            shared.proc.kill()
            shared.proc.wait(10)
            at.append(Stop(ms, origin, self.origin.counts()))
            read = [metric(m, "nfsgw_prefetch_pass_read_files") for m in ms]
            log(f"  SIGKILL the shared tier's proxy: loaded {done}, read {read}")

        monitor = {"3": kill_gateway, "4": kill_shared}.get(key)
        t0 = time.monotonic()
        got = run_readers(
            readers, self.manifest, self.orders(), t0 + self.a.timeout, monitor=monitor
        )
        wall = time.monotonic() - t0
        for i, g in enumerate(gws):
            r = GwResult(g.name)
            res = got[i]
            if key == "3" and i == 0:
                r.killed = True
                r.failure = res if isinstance(res, str) else "finished before the kill"
            elif isinstance(res, str):
                r.failure = res
            else:
                read_result(r, *res)
            s.gateways.append(r)
        live = [i for i, r in enumerate(s.gateways) if not r.killed]
        for i in live:
            quiet(gws[i])
        if key == "4":
            time.sleep(1.0)  # a lookup refused just now counts before the scrape
        for i in live:
            r = s.gateways[i]
            r.cpu_s = round(cpu_seconds(gws[i].pid) - cpu0[i], 2)
            r.cpu_ms_per_file = round(r.cpu_s / r.files * 1e3, 3) if r.files else 0.0
            fill(r, gws[i].metrics(), m0[i])
        o1 = self.origin.counts()
        s1 = shared.counts() if shared.proc.poll() is None else {}
        gets = o1.get("GET", 0) - o0.get("GET", 0)
        s.fleet = {
            "objects": n,
            "wall_s": round(wall, 2),
            "fleet_files_per_s": round(sum(r.files for r in s.gateways) / wall, 1),
            "origin_gets": gets,
            "origin_lists": o1.get("LIST", 0) - o0.get("LIST", 0),
            "origin_gets_per_object": round(gets / n, 4),
            "foreign_fetches": sum(r.foreign_fetches for r in s.gateways),
            "fills_skipped": sum(r.fills_skipped for r in s.gateways),
            "errors": sum(r.errors for i, r in enumerate(s.gateways) if i in live),
            "files_read": sum(r.files for i, r in enumerate(s.gateways) if i in live),
        }
        if s1:
            s.fleet["shared_gets"] = s1.get("GET", 0) - s0.get("GET", 0)
            s.fleet["shared_puts"] = s1.get("PUT", 0) - s0.get("PUT", 0)
        complete = all(s.gateways[i].files == n and not s.gateways[i].failure for i in live)
        target(s, "wrong or unread files", s.fleet["errors"], 0, "==")
        target(s, "every live gateway read every file", float(complete), 1, "==")
        if key == "2":
            target(s, "origin GETs per object", gets / n, 1.05, "<=")
        elif key == "3":
            target(s, "origin GETs per object", gets / n, 1.10, "<=")
            if not at:
                s.notes.append("gateway 1 was never killed (it had not loaded half the objects)")
            else:
                k = at[0]
                s.fleet["victim_loaded_at_kill"] = round(loaded(k.metrics[0]) - loaded(m0[0]))
                s.fleet["victim_read_at_kill"] = metric(
                    k.metrics[0], "nfsgw_prefetch_pass_read_files"
                )
                s.fleet["victim_origin_gets_at_kill"] = d(
                    k.metrics[0], m0[0], "nfsgw_data_gets_total"
                )
                s.fleet["origin_gets_after_kill"] = o1.get("GET", 0) - k.origin.get("GET", 0)
            target(s, "killed", float(bool(at)), 1, "==")
        elif key == "4":
            if not at:
                s.notes.append("the shared tier was never stopped (the fleet loaded < half)")
                target(s, "shared tier stopped", 0, 1, "==")
            else:
                ms_at, origin_at = at[0].metrics, at[0].origin
                remaining = 0
                after_sum = 0
                for i in live:
                    m = gws[i].metrics()
                    left = n - (loaded(ms_at[i]) - loaded(m0[i]))
                    after = metric(m, "nfsgw_data_gets_total") - metric(
                        ms_at[i], "nfsgw_data_gets_total"
                    )
                    remaining += round(left)
                    after_sum += round(after)
                    s.fleet[f"gw{i + 1}_remaining_at_stop"] = round(left)
                    s.fleet[f"gw{i + 1}_origin_gets_after_stop"] = round(after)
                    target(
                        s,
                        f"gw{i + 1} origin GETs after the stop per remaining object",
                        after / left if left else 0.0,
                        1.0,
                        "<=",
                    )
                    target(s, f"gw{i + 1} breaker open", s.gateways[i].breaker_open, 1, "==")
                proxy_after = o1.get("GET", 0) - origin_at.get("GET", 0)
                during = at[0].origin_after_scrape.get("GET", 0) - origin_at.get("GET", 0)
                s.fleet["remaining_at_stop"] = remaining
                s.fleet["origin_gets_after_stop_gateways"] = after_sum
                s.fleet["origin_gets_after_stop_proxy"] = proxy_after
                s.fleet["origin_gets_during_the_scrapes"] = during
                target(
                    s,
                    "fleet origin GETs after the stop per remaining object (proxy, GETs that "
                    "arrived during the scrapes counted as after)",
                    proxy_after / remaining if remaining else 0.0,
                    1.0,
                    "<=",
                )
                target(
                    s,
                    "the same, those counted as before",
                    (proxy_after - during) / remaining if remaining else 0.0,
                    1.0,
                    "<=",
                )
        for r in s.gateways:
            log(f"  {describe(r)}")
        return s


def describe(r: GwResult) -> str:
    if r.killed:
        return f"{r.name}: killed ({r.failure})"
    return (
        f"{r.name}: {r.files} files, {r.files_per_s:,.0f} files/s ({r.files_per_s_with_scan:,.0f} "
        f"with the scan of {r.scan_s:.2f} s), p99 {r.p99_ms} ms, errors {r.errors}, origin "
        f"GETs {r.origin_gets}, shared hits {r.shared_hits} misses {r.shared_misses} fills "
        f"{r.fills} (foreign {r.foreign_fetches}, skipped {r.skipped_by or 0}, errors "
        f"{r.shared_errors}), mean origin GET {r.origin_get_ms} ms, breaker "
        f"{r.breaker_open:g}, CPU {r.cpu_s} s = "
        f"{r.cpu_ms_per_file} ms/file{'; ' + r.failure if r.failure else ''}"
    )


def table(scenarios: Sequence[Scenario]) -> None:
    print(
        "\n| scenario | gateway | files/s | with scan | p99 ms | origin GETs | proxy: origin GET "
        "| shared GET | shared PUT | shared hits | fills | foreign | CPU ms/file | errors |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: |")  # fmt: skip
    for s in scenarios:
        for r in s.gateways:
            if r.killed:
                print(f"| {s.name} | {r.name} | killed | | | | | | | | | | | |")
                continue

            def o(v: int | None) -> str:
                return "" if v is None else f"{v:,}"

            print(
                f"| {s.name} | {r.name} | {r.files_per_s:,.0f} | {r.files_per_s_with_scan:,.0f} "
                f"| {r.p99_ms} | {r.origin_gets:,} | {o(r.proxy_origin_gets)} | "
                f"{o(r.proxy_shared_gets)} | {o(r.proxy_shared_puts)} | {r.shared_hits:,} | "
                f"{r.fills:,} | {r.foreign_fetches:,} | {r.cpu_ms_per_file:.3f} | {r.errors} |"
            )
    print()
    for s in scenarios:
        print(f"{s.name}: " + ", ".join(f"{k} {v}" for k, v in s.fleet.items()))
        for k, t in s.targets.items():
            print(f"  {k}: {t['value']} (target {t['target']}: {'met' if t['met'] else 'NOT met'})")
        for note in s.notes:
            print(f"  note: {note}")


def run(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    keys = [k.strip() for k in a.scenario.split(",") if k.strip()]
    bad = [k for k in keys if k not in SCENARIOS]
    if bad:
        raise SystemExit(f"unknown scenario(s) {bad}: choose from {sorted(SCENARIOS)}")
    scenarios: list[Scenario] = []
    with (
        tempfile.TemporaryDirectory(prefix="nfsgw-fleet-", dir="/var/tmp") as tmp,
        local_copy("c") as tree,
    ):
        assert tree is not None
        work = Path(tmp)
        bench = Bench(a, work, tree)
        try:
            bench.setup()
            for k in keys:
                scenarios.append(bench.scenario(k))
        finally:
            bench.teardown()
            for log_file in work.glob("*.log"):  # the gateways' logs outlive the run
                shutil.copy(log_file, a.out / log_file.name)
    table(scenarios)
    assert bench.manifest is not None
    result = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "cpus": len(os.sched_getaffinity(0)),
        "commit": git_state(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "dataset": {"files": len(bench.manifest.entries), "bytes": bench.manifest.total_bytes},
        "scenarios": [asdict(s) for s in scenarios],
    }
    log(f"results: {write_results(a.out, result)}")
    return 0 if all(t["met"] for s in scenarios for t in s.targets.values()) else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--files", type=int, default=10_000, help="files, in folders of 100")
    p.add_argument("--size", type=int, default=110_000, help="mean file size, bytes")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every origin request")
    p.add_argument(
        "--shared-latency-ms", type=float, default=1.0, help="added to every shared-tier request"
    )
    p.add_argument("--clients", type=int, default=4, help="C reader connections per gateway")
    p.add_argument("--scenario", default="1,2,3,4", help="which, comma-separated (1-4)")
    p.add_argument(
        "--shared-max-inflight-puts",
        type=int,
        default=None,
        help="cache.shared_max_inflight_puts (a diagnosis; default: the gateway's, 16)",
    )
    p.add_argument("--seed", type=int, default=1, help="epoch orders (gateway i: seed + i)")
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on a scenario's reads, s")
    p.add_argument("--out", type=Path, default=OUT, help="results.json and the logs")
    return p.parse_args(argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # finally blocks stop every child


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    with contextlib.suppress(ValueError):  # not the main thread: leave SIGHUP as it is
        signal.signal(signal.SIGHUP, _terminate)
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
