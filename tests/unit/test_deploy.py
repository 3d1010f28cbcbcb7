"""The Kubernetes manifests under deploy/kubernetes render and are valid, with no cluster and no
network: `kubectl kustomize` renders the base and the example overlay (inside a network
namespace of its own when the test may make one), every object validates against the
Kubernetes JSON schemas that the `kubernetes-validate` package bundles (strict: an unknown
field is an error), and the parts that matter to a gateway say what the gateway does: the
host network, probes on the admin API's real open paths at its real address, one node at a
time, the PriorityClass it names, the handle secret at the file the gateway reads, a
configuration `nfsgw check-config` accepts with the DaemonSet's own flags."""

from __future__ import annotations

import argparse
import ast
import base64
import configparser
import copy
import functools
import ipaddress
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.namespace.handles import SECRET_FILE, SECRET_SIZE
from gateway.ops.adminhttp import _OPEN as ADMIN_OPEN_PATHS
from gateway.ops.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
POD_IP = "10.20.3.4"  # what the downward API would give $(POD_IP)

Obj = dict[str, Any]


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl not found: install Debian's kubernetes-client (or kubectl) for "
            "`kubectl kustomize`, which needs no cluster"
        )
    return path


@functools.cache
def _offline_prefix() -> tuple[str, ...]:
    """`unshare --net` where this process may make a network namespace (root, as in CI):
    rendering then provably needs no network. Elsewhere, nothing (kubectl kustomize reads
    only the directory; it still renders)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (unshare, "--net") if ok.returncode == 0 else ()


@functools.cache
def _render(directory: Path) -> tuple[Obj, ...]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["KUBECONFIG"] = "/nonexistent"  # no cluster to find, even by accident
    r = subprocess.run(
        [*_offline_prefix(), _kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, f"kubectl kustomize {directory}: {r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d is not None)


def _one(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} objects"
    return found[0]


def _container(objs: tuple[Obj, ...]) -> Obj:
    pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    c: Obj = pod["containers"][0]
    return c


def _config_text(objs: tuple[Obj, ...]) -> str:
    text: str = _one(objs, "ConfigMap")["data"]["nfsgw.toml"]
    return text


def _validate(obj: Obj) -> None:
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


RENDERED = [pytest.param(BASE, id="base"), pytest.param(OVERLAY, id="overlay")]


@pytest.mark.parametrize("directory", RENDERED)
def test_renders_and_every_object_validates(directory: Path) -> None:
    objs = _render(directory)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        [
            "ConfigMap",
            "DaemonSet",
            "Namespace",
            "PriorityClass",
            "Secret",
            "Secret",
            "Secret",
            "Service",
            "ServiceAccount",
        ]
    )
    for o in objs:
        _validate(o)  # raises with the path of what is wrong


def test_the_validator_catches_a_wrong_field() -> None:
    """A control: the strict schemas refuse a misspelt field and a wrong type, so the test
    above would see them in the manifests."""
    ds = copy.deepcopy(_one(_render(BASE), "DaemonSet"))
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(ds)
    ds = copy.deepcopy(_one(_render(BASE), "DaemonSet"))
    ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = [1]
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(ds)


@pytest.mark.parametrize("directory", RENDERED)
def test_daemonset_on_the_host_network_one_node_at_a_time(directory: Path) -> None:
    objs = _render(directory)
    ds = _one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # the Service's name resolves
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 1
    assert strategy["rollingUpdate"].get("maxSurge", 0) == 0  # port 2049 is the node's
    pc = _one(objs, "PriorityClass", pod["priorityClassName"])
    assert 0 < pc["value"] < 2_000_000_000  # above workloads, below the system classes
    sa = pod["serviceAccountName"]
    _one(objs, "ServiceAccount", sa)
    for o in objs:
        if o["kind"] not in ("Namespace", "PriorityClass"):
            assert o["metadata"]["namespace"] == _one(objs, "Namespace")["metadata"]["name"]


@pytest.mark.parametrize("directory", RENDERED)
def test_probes_hit_the_admin_api_where_it_listens(directory: Path) -> None:
    objs = _render(directory)
    config = tomllib.loads(_config_text(objs))
    host, _, port = config["admin"]["listen"].rpartition(":")
    c = _container(objs)
    probes = {k: c[k]["httpGet"] for k in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    for get in probes.values():
        assert get["path"] in ADMIN_OPEN_PATHS  # answered without a token
        assert get["port"] == int(port)
        # A loopback listen: the probe must name it (else it goes to the pod IP = node IP).
        if ipaddress.ip_address(host).is_loopback:
            assert get["host"] == host
    assert "token_file" not in config["admin"] or not ipaddress.ip_address(host).is_loopback


@pytest.mark.parametrize("directory", RENDERED)
def test_the_config_passes_check_config_with_the_daemonsets_flags(
    directory: Path, tmp_path: Path
) -> None:
    objs = _render(directory)
    c = _container(objs)
    assert c["command"] == ["nfsgw", "serve"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    args = [a.replace("$(POD_IP)", POD_IP) for a in c["args"]]
    assert f"--fleet-self={POD_IP}:2049" in args
    # Every flag is one of `nfsgw serve`'s, spelt in full (argparse would take a prefix),
    # and they parse (argparse exits on a bad value).
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = {o for a in sub.choices["serve"]._actions for o in a.option_strings}
    for a in args:
        if a.startswith("-"):
            assert a.partition("=")[0] in known, f"{a}: not a flag of nfsgw serve"
    parsed = parser.parse_args(["serve", *args])
    assert parsed.command == "serve"
    mounted = {m["mountPath"]: m for m in c["volumeMounts"]}
    config_path = parsed.config
    assert mounted[config_path]["subPath"] == "nfsgw.toml"
    path = tmp_path / "nfsgw.toml"
    path.write_text(_config_text(objs), encoding="utf-8")
    rest = [a for a in args if not a.startswith("--config")]
    r = subprocess.run(
        [sys.executable, "-m", "gateway.ops.cli", "check-config", "--config", str(path), *rest],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 warnings" in r.stdout, r.stdout


@pytest.mark.parametrize("directory", RENDERED)
def test_fleet_membership_is_the_headless_service(directory: Path) -> None:
    objs = _render(directory)
    config = tomllib.loads(_config_text(objs))
    svc = _one(objs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is False
    labels = _one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    meta = svc["metadata"]
    name, _, port = config["fleet"]["members_dns"].rpartition(":")
    assert name == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
    assert int(port) == config["server"]["port"] == svc["spec"]["ports"][0]["port"]
    c = _container(objs)
    assert c["ports"][0]["containerPort"] == config["server"]["port"]


@pytest.mark.parametrize("directory", RENDERED)
def test_every_gateway_reads_one_handle_secret_from_the_secret(directory: Path) -> None:
    objs = _render(directory)
    config = tomllib.loads(_config_text(objs))
    pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in _container(objs)["volumeMounts"]}
    # server.state_dir/handle.secret is the one file the gateway reads the secret from.
    m = mounts[f"{config['server']['state_dir']}/{SECRET_FILE}"]
    secret = _one(objs, "Secret", volumes[m["name"]]["secret"]["secretName"])
    assert m["subPath"] in secret["data"]
    # The shipped file is a placeholder the gateway refuses: no known secret is deployed.
    assert len(base64.b64decode(secret["data"][m["subPath"]])) != SECRET_SIZE
    # The state directory is writable (the spool and the secret's directory), the disk tier
    # is on the node.
    assert "emptyDir" in volumes[mounts[config["server"]["state_dir"]]["name"]]
    assert "hostPath" in volumes[mounts[config["server"]["cache_dir"]]["name"]]


@pytest.mark.parametrize("directory", RENDERED)
def test_credentials_and_references_resolve(directory: Path) -> None:
    objs = _render(directory)
    config = tomllib.loads(_config_text(objs))
    c = _container(objs)
    pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["key"] in _one(objs, "Secret", ref["name"])["data"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= {e["name"] for e in c["env"]}
    for v in pod["volumes"]:
        if "secret" in v:
            _one(objs, "Secret", v["secret"]["secretName"])
        if "configMap" in v:
            _one(objs, "ConfigMap", v["configMap"]["name"])
    # The shared tier's profile is in the credentials file the environment points at.
    creds_file = Path(
        next(e["value"] for e in c["env"] if e["name"] == "AWS_SHARED_CREDENTIALS_FILE")
    )
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(creds_file.parent))
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    secret = _one(objs, "Secret", vol["secret"]["secretName"])
    parser = configparser.ConfigParser()
    parser.read_string(base64.b64decode(secret["data"][creds_file.name]).decode())
    profile = config["cache"]["shared_profile"]
    assert {"aws_access_key_id", "aws_secret_access_key"} <= set(parser[profile])


@pytest.mark.parametrize("directory", RENDERED)
def test_shutdown_covers_the_drain_and_the_process_keeps_one_capability(
    directory: Path,
) -> None:
    objs = _render(directory)
    config = tomllib.loads(_config_text(objs))
    pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
    c = _container(objs)
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = config["server"]["drain_timeout_s"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc.get("privileged", False) is False
    res = c["resources"]
    assert res["requests"]["cpu"] == res["limits"]["cpu"] == str(config["server"]["workers"])
    assert res["requests"]["memory"] == res["limits"]["memory"]  # Guaranteed QoS


def test_overlay_changes_image_buckets_and_nodes() -> None:
    base, overlay = _render(BASE), _render(OVERLAY)
    assert _container(base)["image"] != _container(overlay)["image"]
    assert ":" in _container(overlay)["image"].rpartition("/")[2]  # a tag
    b, o = tomllib.loads(_config_text(base)), tomllib.loads(_config_text(overlay))
    assert b["export"][0]["backend"] != o["export"][0]["backend"]
    assert b["cache"]["shared"] != o["cache"]["shared"]
    pod = _one(overlay, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"]
    assert "nodeSelector" not in _one(base, "DaemonSet")["spec"]["template"]["spec"]


def _examples() -> list[Obj]:
    return [d for f in EXAMPLES for d in yaml.safe_load_all(f.read_text(encoding="utf-8")) if d]


def test_examples_validate_and_mount_the_nodes_own_gateway() -> None:
    objs = _examples()
    for o in objs:
        _validate(o)
    config = tomllib.loads(_config_text(_render(OVERLAY)))
    exports = {e["path"] for e in config["export"]}
    port = config["server"]["port"]
    pvs = [o for o in objs if o["kind"] == "PersistentVolume"]
    assert pvs
    claims = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
    for pv in pvs:
        spec = pv["spec"]
        if "nfs" in spec:
            server, path = spec["nfs"]["server"], spec["nfs"]["path"]
        else:
            attrs = spec["csi"]["volumeAttributes"]
            server, path = attrs["server"], attrs["share"]
        # The mount runs on the node, whose loopback is the node's own gateway (hostNetwork).
        assert server == "127.0.0.1" and path in exports
        assert "127.0.0.1" in config["export_defaults"]["clients"]
        opts = set(spec["mountOptions"])
        assert {"nfsvers=3", "nolock", "nconnect=8", "ro", "nocto", "actimeo=600"} <= opts
        assert {f"port={port}", f"mountport={port}"} <= opts  # no portmapper on 111
        claim = claims[spec["claimRef"]["name"]]
        assert claim["spec"]["volumeName"] == pv["metadata"]["name"]
        assert spec["accessModes"] == claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    job = next(o for o in objs if o["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    claim_names = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claim_names <= claims.keys() and claim_names
    # It lands where the overlay's DaemonSet runs a gateway.
    ds_pod = _one(_render(OVERLAY), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"].items() >= ds_pod["nodeSelector"].items()


def test_job_script_is_an_imagefolder_dataloader_pass() -> None:
    job = next(o for o in _examples() if o["kind"] == "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python", "-c"]
    tree = ast.parse(c["args"][0])  # a syntax error fails here
    called = {
        n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    }
    assert {"ImageFolder", "DataLoader"} <= called


def test_job_script_reads_a_small_image_folder(tmp_path: Path) -> None:
    """The script itself, on a local ImageFolder tree, where torchvision is installed (not in
    the test extra: it is gigabytes)."""
    pytest.importorskip("torchvision")
    from PIL import Image

    for cls in ("a", "b"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (64, 48), (i * 40, 0, 0)).save(tmp_path / "train" / cls / f"{i}.jpg")
    job = next(o for o in _examples() if o["kind"] == "Job")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    env = {**os.environ, "DATA_DIR": str(tmp_path / "train"), "WORKERS": "0", "BATCH": "4"}
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "scan: 10 images in 2 classes" in r.stdout
    assert "done: 10 images" in r.stdout
