#!/usr/bin/env python3
"""check_deploy.py DEPLOY_DIR [--tensordd BIN] [--job FILE]... -- deploy/Dockerfile and deploy/k8s/*.yaml
say what they must, checked offline (no docker, no cluster: parsed, and cross-checked
against each other, the Makefile and the daemon's option table in daemon/config.c).

Dockerfile: a build stage with the CUDA compiler and every -dev package the Makefile's
APT_PKGS builds with; a final stage on a slim base that copies the binaries from it, runs
as a numeric non-root USER, exposes the port it listens on, sets only TENSORDD_* variables
the daemon reads, and has a HEALTHCHECK on /healthz at its metrics address (with curl
installed when it uses curl).

k8s: the manifests parse; a DaemonSet on GPU nodes (nodeSelector, nvidia.com/gpu limit,
cpu and memory requests and limits) runs as the Dockerfile's user with no privilege
escalation; the ConfigMap's file uses only option names, is mounted where the daemon
reads it, and names a token file that is the Secret's key where the Secret is mounted;
readiness and liveness probes ask /healthz on the metrics address of that file (liveness
not failing on a 503: a daemon at --max-sessions is alive; as httpGet, liveness asks
/livez); the token Secret is not a manifest (applying it would reset the token); the
ClusterIP Service has sessionAffinity: ClientIP; the image's TENSORDD_*
variables, which override the file, are cleared or agree; memory-cap is below the memory
limit; the Service selects the pods and targets the port the file listens on; the
kustomization lists every manifest. Process groups across the pods: a headless Service
(clusterIP: None) so ranks find the pods by DNS, and the DaemonSet's --group-address is the
pod's own address (status.podIP). Each --job FILE (default: examples/k8s/*.yaml) is a Job in
the daemons' namespace that names a headless Service and its port, mounts the token Secret
where its TENSORDD_TOKEN_FILE says, and does not run as root. With --tensordd, the daemon itself checks the file
(--check-config), with the token file pointed at a temporary one.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
bad = []


def fail(msg):
    bad.append(msg)


# ---------------------------------------------------------------- sources of truth

def option_names():
    text = open(os.path.join(ROOT, "daemon", "config.c"), encoding="utf-8").read()
    names = set(re.findall(r'^\s*\{"([a-z][a-z0-9-]*)",', text, flags=re.M))
    m = re.search(r"env_options\[\]\s*=\s*\{([^}]*)\}", text)
    env = {"TENSORDD_" + n.upper().replace("-", "_") for n in re.findall(r'"([a-z-]+)"', m.group(1))} \
        if m else None
    return names, env


# -dev packages of APT_PKGS that the image's binaries (tensordd, tdctl) do not build with:
# the unit tests' (check, subunit) and the Python client's C accelerator's (python3-dev).
NOT_FOR_THE_IMAGE = {"check", "libsubunit-dev", "python3-dev"}


def apt_dev_packages():
    text = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    m = re.search(r"^APT_PKGS\s*:=\s*((?:.*\\\n)*.*)$", text, flags=re.M)
    pkgs = m.group(1).replace("\\\n", " ").split() if m else []
    return {p for p in pkgs if p.endswith("-dev") and p not in NOT_FOR_THE_IMAGE}


def parse_bytes(v):
    m = re.fullmatch(r"(\d+)([KMGT]?)", v.strip())
    if not m:
        return None
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")


def parse_quantity(v):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(v))
    if not m:
        return None
    mul = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2)]
    return int(m.group(1)) * mul


def host_port(url_or_addr):
    m = re.search(r"(?:https?://|tcp://)?(\[[^\]]+\]|[\w.-]+):(\d+)", url_or_addr)
    return (m.group(1), int(m.group(2))) if m else None


# ---------------------------------------------------------------- Dockerfile

def dockerfile(path, env_names):
    lines, cur = [], ""
    for raw in open(path, encoding="utf-8"):
        s = raw.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append((cur + s).strip())
        cur = ""
    stages = []
    for ln in lines:
        word, _, rest = ln.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, flags=re.I)
            stages.append({"base": m.group(1), "name": m.group(2), "ins": []})
        elif stages:
            stages[-1]["ins"].append((word, rest))
        elif word not in ("ARG",):
            fail("Dockerfile: %s before the first FROM" % word)
    if len(stages) < 2:
        fail("Dockerfile: not multi-stage (%d stage)" % len(stages))
        return None
    build, final = stages[0], stages[-1]
    build_runs = " ".join(r for w, r in build["ins"] if w == "RUN")
    if "cuda-nvcc" not in build_runs:
        fail("Dockerfile: the build stage installs no CUDA compiler (cuda-nvcc)")
    for p in sorted(apt_dev_packages()):
        if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(p), build_runs):
            fail("Dockerfile: the build stage does not install %s (in the Makefile's APT_PKGS): "
                 "add it there, or to NOT_FOR_THE_IMAGE in tools/check_deploy.py when tensordd "
                 "and tdctl do not build with it" % p)
    if "slim" not in final["base"]:
        fail("Dockerfile: the final stage's base %s is not a slim image" % final["base"])
    copies = [r for w, r in final["ins"] if w == "COPY"]
    if not any(("--from=%s" % build["name"]) in c and "tensordd" in c for c in copies):
        fail("Dockerfile: the final stage does not COPY tensordd --from=%s" % build["name"])
    users = [r.strip() for w, r in final["ins"] if w == "USER"]
    uid = None
    if not users:
        fail("Dockerfile: the final stage has no USER (it would run as root)")
    else:
        u = users[-1].split(":")[0]
        if not u.isdigit():
            fail("Dockerfile: USER %s is not numeric (Kubernetes' runAsNonRoot cannot verify a "
                 "name)" % users[-1])
        elif int(u) == 0:
            fail("Dockerfile: USER is root")
        else:
            uid = int(u)
    env = {}
    for w, r in final["ins"]:
        if w == "ENV":
            for tok in shlex.split(r):
                k, _, v = tok.partition("=")
                env[k] = v
    for k in env:
        if k.startswith("TENSORDD_") and env_names is not None and k not in env_names:
            fail("Dockerfile: ENV %s is not a variable the daemon reads (%s)"
                 % (k, ", ".join(sorted(env_names))))
    hc = [r for w, r in final["ins"] if w == "HEALTHCHECK"]
    metrics = host_port(env.get("TENSORDD_METRICS_LISTEN", ""))
    if not hc:
        fail("Dockerfile: no HEALTHCHECK")
    elif not metrics:
        fail("Dockerfile: HEALTHCHECK without TENSORDD_METRICS_LISTEN (no /healthz to ask)")
    else:
        url = re.search(r"https?://\S+", hc[0])
        asked = host_port(url.group(0)) if url else None
        if metrics and metrics[0] in ("0.0.0.0", "[::]") and asked:
            asked = (metrics[0], asked[1]) if asked[0] in ("127.0.0.1", "localhost") else asked
        if not url or not url.group(0).endswith("/healthz") or asked != metrics:
            fail("Dockerfile: HEALTHCHECK does not ask /healthz on %s:%d" % metrics)
    final_runs = " ".join(r for w, r in final["ins"] if w == "RUN")
    installed = {p for seg in re.findall(r"apt-get install([^&;]*)", final_runs)
                 for p in seg.split() if not p.startswith("-")}
    if hc and "curl" in hc[0] and "curl" not in installed:
        fail("Dockerfile: HEALTHCHECK (and the probes) run curl, which the final stage does "
             "not install")
    listen = host_port(env.get("TENSORDD_LISTEN", ""))
    exposed = {int(p.split("/")[0]) for w, r in final["ins"] if w == "EXPOSE" for p in r.split()}
    if listen and listen[1] not in exposed:
        fail("Dockerfile: listens on port %d but EXPOSEs %s" % (listen[1], sorted(exposed)))
    ep = [r for w, r in final["ins"] if w == "ENTRYPOINT"]
    if not ep or "tensordd" not in ep[-1]:
        fail("Dockerfile: the ENTRYPOINT is not tensordd")
    return {"uid": uid, "env": env}


# ---------------------------------------------------------------- manifests

def ini(text):
    kv = []
    for n, ln in enumerate(text.splitlines(), 1):
        s = ln.strip()
        if not s or s[0] in "#;":
            continue
        k, eq, v = s.partition("=")
        if not eq:
            fail("configmap: line %d is not key = value: %r" % (n, ln))
            continue
        kv.append((k.strip(), v.strip()))
    return kv


def k8s(kdir, options, docker, tensordd):
    docs, files = [], sorted(f for f in os.listdir(kdir) if f.endswith(".yaml"))
    for f in files:
        try:
            for d in yaml.safe_load_all(open(os.path.join(kdir, f), encoding="utf-8")):
                if d:
                    docs.append((f, d))
        except yaml.YAMLError as e:
            fail("%s: does not parse: %s" % (f, e))
    by_kind = {}
    for f, d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    for kind in ("Namespace", "ConfigMap", "DaemonSet", "Service", "Kustomization"):
        if kind not in by_kind:
            fail("k8s: no %s" % kind)
    for sec in by_kind.get("Secret", []):
        fail("k8s: Secret %s is a manifest: `kubectl apply -k` would write its token back on "
             "every apply; create it once (kustomization.yaml says how)"
             % sec["metadata"].get("name"))
    if bad:
        return
    kust = by_kind["Kustomization"][0]
    listed = set(kust.get("resources", []))
    for f in files:
        if f != "kustomization.yaml" and f not in listed:
            fail("kustomization.yaml does not list %s" % f)

    ds = by_kind["DaemonSet"][0]
    pod = ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"].get("labels", {})
    if ds["spec"]["selector"].get("matchLabels", {}).items() - labels.items():
        fail("DaemonSet: its selector does not match its pods' labels")
    if not pod.get("nodeSelector"):
        fail("DaemonSet: no nodeSelector (it would run on nodes without a GPU)")
    c = pod["containers"][0]
    res = c.get("resources", {})
    lim, req = res.get("limits", {}), res.get("requests", {})
    if int(lim.get("nvidia.com/gpu", 0)) < 1:
        fail("DaemonSet: no nvidia.com/gpu limit")
    for k in ("cpu", "memory"):
        if k not in lim or k not in req:
            fail("DaemonSet: no %s request and limit" % k)
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    run_as = csc.get("runAsUser", psc.get("runAsUser"))
    if not (csc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
        fail("DaemonSet: runAsNonRoot is not set")
    if run_as in (None, 0):
        fail("DaemonSet: runAsUser is %s" % run_as)
    elif docker and docker["uid"] is not None and run_as != docker["uid"]:
        fail("DaemonSet: runAsUser %s is not the image's USER %s" % (run_as, docker["uid"]))
    if csc.get("allowPrivilegeEscalation") is not False:
        fail("DaemonSet: allowPrivilegeEscalation is not false")

    # the configuration file, where the daemon reads it
    cm = by_kind["ConfigMap"][0]
    conf_text = cm.get("data", {}).get("tensordd.conf")
    if conf_text is None:
        fail("ConfigMap %s has no tensordd.conf" % cm["metadata"]["name"])
        return
    conf = ini(conf_text)
    for k, _ in conf:
        if k not in options:
            fail("ConfigMap: tensordd.conf key '%s' is not an option of the daemon" % k)
    cfg = dict(conf)
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}

    def mounted_path(kind, name, key):
        for vn, v in vols.items():
            src = v.get(kind)
            if not src or src.get("name" if kind == "configMap" else "secretName") != name:
                continue
            items = src.get("items")
            path = key if not items else next((i["path"] for i in items if i["key"] == key), None)
            if path and vn in mounts:
                sub = mounts[vn].get("subPath")
                if sub:  # that one file of the volume, mounted at mountPath
                    return mounts[vn]["mountPath"] if sub == path else None
                return os.path.join(mounts[vn]["mountPath"], path)
        return None

    conf_path = mounted_path("configMap", cm["metadata"]["name"], "tensordd.conf")
    args = c.get("args", []) + c.get("command", [])
    want_conf = args[args.index("--config") + 1] if "--config" in args else \
        "/etc/tensordd/tensordd.conf"
    if conf_path != want_conf:
        fail("DaemonSet: the daemon reads %s but the ConfigMap is mounted at %s"
             % (want_conf, conf_path))
    # the token Secret (created once, not a manifest): the volume whose key lands on it
    token_file = cfg.get("token-file")
    secret = None
    if not token_file:
        fail("ConfigMap: no token-file (a listener beyond loopback needs a token)")
    else:
        for v in vols.values():
            src = v.get("secret")
            if src and mounted_path("secret", src.get("secretName"), "token") == token_file:
                secret = src.get("secretName")
        if not secret:
            fail("DaemonSet: token-file %s is not where a Secret's key `token` is mounted"
                 % token_file)
    # the image's environment overrides the file: cleared or in agreement
    if docker:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        for k, v in docker["env"].items():
            if not k.startswith("TENSORDD_"):
                continue
            opt = k[len("TENSORDD_"):].lower().replace("_", "-")
            if env.get(k, v) not in ("", cfg.get(opt)):
                fail("DaemonSet: the image's %s=%s overrides the file's %s = %s; clear it "
                     "(value \"\") or agree" % (k, env.get(k, v), opt, cfg.get(opt)))

    # probes on /healthz at the file's metrics address
    metrics = host_port(cfg.get("metrics-listen", ""))
    if not metrics:
        fail("ConfigMap: no metrics-listen, so no /healthz for the probes")
    for name in ("readinessProbe", "livenessProbe"):
        p = c.get(name)
        if not p:
            fail("DaemonSet: no %s" % name)
            continue
        if "exec" in p:
            cmd = p["exec"]["command"]
            url = next((a for a in cmd if "://" in a), "")
            if not url.endswith("/healthz") or (metrics and host_port(url) != metrics):
                fail("DaemonSet: %s asks %r, not /healthz on the metrics address %s"
                     % (name, url, metrics))
            fails_on_status = any(a in ("-f", "--fail") or (re.fullmatch(r"-[a-zA-Z]+", a)
                                  and "f" in a) for a in cmd[1:])
            if name == "readinessProbe" and not fails_on_status:
                fail("DaemonSet: readinessProbe does not fail on a 503 (curl -f)")
            if name == "livenessProbe" and fails_on_status:
                fail("DaemonSet: livenessProbe fails on a 503: a daemon at --max-sessions "
                     "would be restarted with its sessions")
        elif "httpGet" in p:
            g = p["httpGet"]
            # liveness: /livez (200 whenever the loop answers), since an httpGet fails on
            # /healthz's 503 and a daemon at --max-sessions is alive
            want = "/healthz" if name == "readinessProbe" else "/livez"
            if g.get("path") != want or (metrics and g.get("port") != metrics[1]):
                fail("DaemonSet: %s httpGet is not %s on port %s" % (name, want, metrics))
            if metrics and metrics[0] in ("127.0.0.1", "[::1]", "localhost") and \
                    not pod.get("hostNetwork"):
                fail("DaemonSet: %s httpGet cannot reach %s:%d on the pod's loopback"
                     % (name, metrics[0], metrics[1]))
        else:
            fail("DaemonSet: %s is neither exec nor httpGet" % name)

    cap, mem = parse_bytes(cfg.get("memory-cap", "")), parse_quantity(lim.get("memory", ""))
    if cap is None or mem is None or cap >= mem:
        fail("DaemonSet: memory-cap (%s) must be set and below the memory limit (%s)"
             % (cfg.get("memory-cap"), lim.get("memory")))

    listen = host_port(cfg.get("listen", ""))
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    for svc in by_kind["Service"]:
        what = "Service %s" % svc["metadata"].get("name")
        if svc["spec"].get("clusterIP") != "None" and \
                svc["spec"].get("sessionAffinity") != "ClientIP":
            fail("%s: no sessionAffinity: ClientIP (a client's next connection, or its "
                 "resume, could land on another node's daemon)" % what)
        if svc["spec"].get("selector", {}).items() - labels.items():
            fail("%s: its selector does not match the DaemonSet's pods" % what)
        for sp in svc["spec"].get("ports", []):
            tp = sp.get("targetPort", sp.get("port"))
            cport = ports.get(tp, tp)
            if not listen or cport != listen[1]:
                fail("%s: targets port %s, the daemon listens on %s" % (what, cport, listen))
    if tensordd and token_file:
        with tempfile.TemporaryDirectory() as tmp:
            tok = os.path.join(tmp, "token")
            with open(tok, "w") as f:
                f.write("x" * 32 + "\n")
            os.chmod(tok, 0o600)
            conf_file = os.path.join(tmp, "tensordd.conf")
            with open(conf_file, "w") as f:
                f.write(conf_text.replace(token_file, tok))
            env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORDD_")}
            r = subprocess.run([tensordd, "--config", conf_file, "--check-config"],
                               capture_output=True, text=True, env=env, timeout=60)
            if r.returncode != 0:
                fail("ConfigMap: tensordd --check-config rejects tensordd.conf: %s"
                     % (r.stderr.strip() or r.stdout.strip()))
    # process groups across the pods: ranks found by DNS, peers reaching each pod's address
    ns = ds["metadata"].get("namespace", "default")
    headless = {(svc["metadata"]["name"], sp["port"]) for svc in by_kind["Service"]
                if svc["spec"].get("clusterIP") == "None" for sp in svc["spec"].get("ports", [])}
    if not headless:
        fail("k8s: no headless Service (clusterIP: None): process-group ranks cannot find the "
             "daemon pods by DNS")
    env_from = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                for e in c.get("env", [])}
    ga = args[args.index("--group-address") + 1] if "--group-address" in args[:-1] else ""
    m = re.fullmatch(r"\$\((\w+)\)", ga)
    if not m or env_from.get(m.group(1)) != "status.podIP":
        fail("DaemonSet: no --group-address $(VAR) with VAR the pod's status.podIP: the "
             "daemons of a process group could not reach each other")
    return {"ns": ns, "headless": headless, "secret": secret,
            "token_path": token_file, "mounted_path": mounted_path}

def job(path, ctx):
    """A Job of examples/k8s that trains across the DaemonSet's pods: in its namespace,
    finding the ranks through a headless Service (NAME[.NS.svc...]:PORT in its command), with
    the daemons' token Secret mounted where TENSORDD_TOKEN_FILE says, not as root."""
    name = os.path.relpath(path, ROOT)
    try:
        docs = [d for d in yaml.safe_load_all(open(path, encoding="utf-8")) if d]
    except yaml.YAMLError as e:
        fail("%s: does not parse: %s" % (name, e))
        return
    for d in docs:
        if d.get("kind") != "Job":
            continue
        if d["metadata"].get("namespace", "default") != ctx["ns"]:
            fail("%s: Job in namespace %s, the daemons are in %s"
                 % (name, d["metadata"].get("namespace"), ctx["ns"]))
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        words = " ".join(str(a) for a in c.get("command", []) + c.get("args", []))
        found = False
        for svc, port in ctx["headless"]:
            pat = r"(?<![\w.-])%s(\.%s(\.svc(\.cluster\.local)?)?)?:%d(?!\d)" % (
                re.escape(svc), re.escape(ctx["ns"]), port)
            found = found or re.search(pat, words) is not None
        if not found:
            fail("%s: its command names no headless Service of the daemons with its port (%s)"
                 % (name, ", ".join("%s:%d" % h for h in sorted(ctx["headless"]))))
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        want = env.get("TENSORDD_TOKEN_FILE")
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        have = None
        for v in pod.get("volumes", []):
            src = v.get("secret")
            if src and src.get("secretName") == ctx["secret"] and v["name"] in mounts:
                items = src.get("items")
                key_path = next((i["path"] for i in items if i["key"] == "token"), None) \
                    if items else "token"
                if key_path:
                    have = os.path.join(mounts[v["name"]], key_path)
        if not want or want != have:
            fail("%s: TENSORDD_TOKEN_FILE %s is not where the Secret %s's token is mounted (%s)"
                 % (name, want, ctx["secret"], have))
        psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
        if not csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            fail("%s: runAsNonRoot is not set" % name)
        return
    fail("%s: no Job" % name)


def main():
    args = sys.argv[1:]
    tensordd = None
    jobs = []
    while "--job" in args:
        i = args.index("--job")
        jobs.append(args[i + 1])
        del args[i:i + 2]
    if not jobs:
        kdir = os.path.join(ROOT, "examples", "k8s")
        jobs = sorted(os.path.join(kdir, f) for f in os.listdir(kdir) if f.endswith(".yaml")) \
            if os.path.isdir(kdir) else []
    if "--tensordd" in args:
        i = args.index("--tensordd")
        tensordd = args[i + 1]
        del args[i:i + 2]
        if "--check-config" not in subprocess.run([tensordd, "--help"], capture_output=True,
                                                  text=True).stdout:
            tensordd = None  # an older daemon: the keys are still checked against config.c
    if len(args) != 1:
        sys.exit(__doc__)
    deploy = args[0]
    options, env_names = option_names()
    docker = dockerfile(os.path.join(deploy, "Dockerfile"), env_names)
    ctx = k8s(os.path.join(deploy, "k8s"), options, docker, tensordd)
    for j in jobs if ctx else []:
        job(j, ctx)
    for b in bad:
        print("deploy: " + b, file=sys.stderr)
    if bad:
        return 1
    print("deploy: Dockerfile (multi-stage, non-root, HEALTHCHECK on /healthz) and k8s "
          "manifests (GPU DaemonSet, httpGet probes on /healthz and /livez, token Secret "
          "created once, Service with session affinity, ConfigMap of options%s, "
          "headless Service for process groups, %d training Job(s)) agree"
          % (", checked by tensordd --check-config" if tensordd else "", len(jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
