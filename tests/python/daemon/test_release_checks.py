"""The release checks (tools/check_protocol_doc.py, tools/check_deploy.py,
tools/abi/check_abi.py) pass on the tree and fail on a copy with one thing wrong:
each mutation below is a mistake the check exists to catch."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PY = sys.executable


def run(*args):
    return subprocess.run([PY, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def mutated(tmp_path, rel, old, new):
    """A copy of ROOT/rel with the first `old` replaced by `new` (which must be there)."""
    text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
    assert old in text, f"{rel} no longer holds {old!r}: update this test"
    dst = tmp_path / os.path.basename(rel)
    dst.write_text(text.replace(old, new, 1))
    return str(dst)


# ---------------------------------------------------------------- protocol spec

PROTO, SPEC = "proto/tensordd.proto", "docs/protocol.md"


def test_protocol_doc_passes():
    r = run("tools/check_protocol_doc.py", PROTO, SPEC)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("old,new,why", [
    ("| `DEVICE_ERROR` | 23 |", "| `DEVICE_ERR` | 23 |", "DEVICE_ERROR has no row"),
    ("| `POISONED` | 13 |", "| `POISONED` | 12 |", "POISONED is 13 in the proto"),
    ("### `Sync`", "### Sync", "Sync (Request.sync) has no"),
    ("`ListDevicesReply`", "`ListDeviceReply`", "`ListDeviceReply`, which is no message"),
    ("`Upload.handle`", "`Upload.handles`", "Upload has no field handles"),
    ("`HANDLE_GRAPH`", "`HANDLE_GRAPHS`", "`HANDLE_GRAPHS`, which is no enum value"),
])
def test_protocol_doc_catches(tmp_path, old, new, why):
    r = run("tools/check_protocol_doc.py", PROTO, mutated(tmp_path, SPEC, old, new))
    assert r.returncode == 1 and why in r.stderr, r.stderr


def test_protocol_doc_catches_a_new_request(tmp_path):
    proto = mutated(tmp_path, PROTO, "    Goodbye goodbye = 27;",
                    "    Goodbye goodbye = 27;\n    Sync flush = 99;")
    r = run("tools/check_protocol_doc.py", proto, SPEC)
    assert r.returncode == 1 and "request Flush" in r.stderr, r.stderr


# ---------------------------------------------------------------- deploy


def deploy_copy(tmp_path, rel=None, old=None, new=None):
    d = tmp_path / "deploy"
    shutil.copytree(os.path.join(ROOT, "deploy"), d)
    if rel:
        p = d / rel
        text = p.read_text()
        assert old in text, f"deploy/{rel} no longer holds {old!r}: update this test"
        p.write_text(text.replace(old, new, 1))
    return str(d)


def test_deploy_passes(tmp_path):
    r = run("tools/check_deploy.py", deploy_copy(tmp_path))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("rel,old,new,why", [
    ("Dockerfile", "USER 10001:10001", "USER 0", "USER is root"),
    ("Dockerfile", "9470/healthz", "9470/metrics", "HEALTHCHECK does not ask /healthz"),
    ("k8s/daemonset.yaml", "path: /livez", "path: /healthz", "livenessProbe httpGet is not /livez"),
    ("k8s/daemonset.yaml", "path: /healthz", "path: /metrics",
     "readinessProbe httpGet is not /healthz"),
    ("k8s/namespace.yaml", "kind: Namespace\n",
     "kind: Namespace\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: tensordd-token\n"
     "stringData:\n  token: \"\"\n", "is a manifest"),
    ("k8s/service.yaml", "  sessionAffinity: ClientIP\n", "", "no sessionAffinity: ClientIP"),
    ("k8s/daemonset.yaml", "mountPath: /run/secrets/tensordd", "mountPath: /run/secrets/x",
     "token-file /run/secrets/tensordd/token is not where"),
    ("k8s/daemonset.yaml", "nvidia.com/gpu: 1\n          # The kubelet",
     "cpu-extra: 1\n          # The kubelet", "no nvidia.com/gpu limit"),
    ("k8s/daemonset.yaml", "runAsNonRoot: true", "runAsNonRoot: false", "runAsNonRoot"),
    ("k8s/configmap.yaml", "max-sessions = 64", "max-session = 64",
     "'max-session' is not an option"),
    ("k8s/configmap.yaml", "0.0.0.0:9470", "0.0.0.0:9471", "is not /healthz on port"),
    ("k8s/service.yaml", "  clusterIP: None\n", "", "no headless Service"),
    ("k8s/daemonset.yaml", '"--group-address", "$(POD_IP)"', '"--group-address", "0.0.0.0"',
     "no --group-address $(VAR)"),
])
def test_deploy_catches(tmp_path, rel, old, new, why):
    r = run("tools/check_deploy.py", deploy_copy(tmp_path, rel, old, new))
    assert r.returncode == 1 and why in r.stderr, r.stderr


JOB = "examples/k8s/train-digits-dp-job.yaml"


@pytest.mark.parametrize("old,new,why", [
    ("tensordd-ranks.tensordd.svc.cluster.local:7070", "tensordd.tensordd.svc.cluster.local:7070",
     "names no headless Service"),
    ("value: /run/secrets/tensordd/token", "value: /run/secrets/x/token",
     "TENSORDD_TOKEN_FILE /run/secrets/x/token is not where"),
    ("namespace: tensordd", "namespace: default", "Job in namespace default"),
])
def test_deploy_catches_a_training_job_that_cannot_reach_the_ranks(tmp_path, old, new, why):
    r = run("tools/check_deploy.py", deploy_copy(tmp_path), "--job", mutated(tmp_path, JOB, old, new))
    assert r.returncode == 1 and why in r.stderr, r.stderr


# ---------------------------------------------------------------- library ABI


def built_library():
    lib = os.path.join(os.path.dirname(os.path.abspath(os.environ.get("TDD_BIN", "build/x"))),
                       "libtensordd.so")
    if not os.path.isfile(lib):
        pytest.skip(f"{lib} not built")
    return lib


HEADERS = ["include/tensordd.h", "include/td_error.h", "include/td_dtype.h", "include/td_attr.h"]


def abi(lib, symbols="tools/abi/libtensordd.symbols", mapfile="client/lib/libtensordd.map"):
    return run("tools/abi/check_abi.py", "--lib", lib, "--symbols", symbols, "--map", mapfile,
               *HEADERS)


def test_abi_passes():
    r = abi(built_library())
    assert r.returncode == 0, r.stderr


def test_abi_catches_a_removed_symbol_and_a_new_soname(tmp_path):
    lib = built_library()
    rec = mutated(tmp_path, "tools/abi/libtensordd.symbols", "td_sync\n", "td_sync\ntd_gone\n")
    r = abi(lib, symbols=rec)
    assert r.returncode == 1 and "td_gone is in the record but not exported" in r.stderr
    rec = mutated(tmp_path, "tools/abi/libtensordd.symbols", "soname libtensordd.so.0",
                  "soname libtensordd.so.1")
    r = abi(lib, symbols=rec)
    assert r.returncode == 1 and "soname is libtensordd.so.0" in r.stderr


def test_abi_catches_a_function_the_map_would_hide(tmp_path):
    lib = built_library()
    text = open(os.path.join(ROOT, "client/lib/libtensordd.map"), encoding="utf-8").read()
    assert re.search(r"^\s*td_ping;\n", text, flags=re.M)
    m = tmp_path / "libtensordd.map"
    m.write_text(re.sub(r"^\s*td_ping;\n", "", text, flags=re.M))
    r = abi(lib, mapfile=str(m))
    assert r.returncode == 1 and "td_ping is declared in the headers but not in" in r.stderr
