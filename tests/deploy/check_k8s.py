#!/usr/bin/env python3
"""ctest -L deploy: the Kubernetes manifests of deploy/k8s.

  check_k8s.py SOURCE_DIR BINARY_DIR

1. `kubectl kustomize` renders the base, the cpu, gpu and monitoring
   overlays and the examples, offline.
2. Every rendered object (the monitoring overlay's ServiceMonitor and
   PrometheusRule included) and the Secrets deploy/k8s/make-secrets writes
   validate against the Kubernetes API schema (kubernetes-models and its
   Prometheus Operator models, tests/deploy/k8s/validate.js).
3. Structural checks against the real binaries (BINARY_DIR/bin): every flag
   and STAGEWISE_* variable a container is given appears in that binary's
   --help; probes point at the --health-listen port; container and Service
   ports match --listen and --metrics-listen; a worker advertises
   $(POD_NAME).<its headless Service>; the coordinator address names the
   coordinator's Service and port; every TLS, CA and token path lies in a
   mounted Secret that holds that key (and make-secrets makes every Secret
   and key the manifests use, with certificates that verify against the CA
   for the name the manifests verify); writable paths are volumes under a
   read-only root; images are the ones deploy/image/build makes; the gpu
   overlay asks for a GPU and runs cuda:0; in both overlays the checkpointed
   job saves under a ReadWriteMany volume mounted at --checkpoint-root on
   every process, and the coordinator has a budget that allows no eviction; the submit example's job files pass `stagewise validate`; the
   replicated example sizes the worker StatefulSet stages.count x
   stages.replicas of the job it submits; the workers' NetworkPolicy lets
   workers (and only them) reach the gRPC port and gloo's ephemeral ports,
   and leaves metrics and health open. The monitoring overlay
   (monitoring_checks.py): the ServiceMonitor has the `release` label,
   honours no labels and maps exported_job to job_id (prometheus.yml too);
   the PrometheusRule holds the rules file's groups, StagewiseCoordinatorDown
   and a runbook_url into a section of deploy/README.md on every alert; every
   dashboard is a ConfigMap with the sidecar label holding the very file.
4. The checks can fail: known breakages of the rendered cpu overlay (a probe
   on the wrong port, an unknown flag, another advertised name, a missing
   Secret mount, a wrong image, a Service port without a container port) and
   of the monitoring overlay (no `release` label, labels honoured, no
   job_id relabelling, an alert without runbook, a dashboard without the
   sidecar label or unlike its file) must each be reported.

Exit 77 (skipped) without kubectl, node or the validator's node_modules
(scripts/setup installs them).
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monitoring_checks  # noqa: E402

SRC = os.path.abspath(sys.argv[1])
BIN = os.path.join(os.path.abspath(sys.argv[2]), "bin")
K8S = os.path.join(SRC, "deploy", "k8s")
VALIDATOR_DIR = os.path.join(SRC, "tests", "deploy", "k8s")
BINARIES = ("stagewise", "stagewise-coordinator", "stagewise-worker")
TARGETS = ("base", "overlays/cpu", "overlays/gpu", "overlays/monitoring",
           "examples/submit", "examples/replicated")
# Where gloo's connections between replicas land: Linux's default
# net.ipv4.ip_local_port_range (gloo binds port 0).
EPHEMERAL = (32768, 60999)


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


# ---------------------------------------------------------------- rendering

def kubectl_minor():
    out = json.loads(run(["kubectl", "version", "--client", "-o", "json"]))
    return int(re.match(r"\d+", out["clientVersion"]["minor"]).group())


def legacy_copy(tmp):
    """kubectl <= 1.20 embeds kustomize 2.0.3, which takes directories in
    `bases` and strategic-merge patches in `patchesStrategicMerge`. The
    manifests use today's spelling (`resources`, `patches: - path:`,
    `replicas:`); for an
    old kubectl, render a copy with the old spelling. The copy is of deploy/
    (the monitoring overlay builds on deploy/prometheus and deploy/grafana)."""
    deploy = os.path.join(tmp, "deploy")
    shutil.copytree(os.path.dirname(K8S), deploy)
    dst = os.path.join(deploy, "k8s")
    for root, _, files in os.walk(deploy):
        if "kustomization.yaml" not in files:
            continue
        path = os.path.join(root, "kustomization.yaml")
        k = yaml.safe_load(open(path))
        dirs = [r for r in k.get("resources", []) if os.path.isdir(os.path.join(root, r))]
        if dirs:
            k["resources"] = [r for r in k["resources"] if r not in dirs]
            k["bases"] = dirs
        if "patches" in k:
            k["patchesStrategicMerge"] = [p["path"] for p in k.pop("patches")]
        # `replicas:` (kustomize 2.1) as a strategic-merge patch of each
        # StatefulSet named (the only kind the manifests scale).
        for n, r in enumerate(k.pop("replicas", [])):
            patch = f"legacy-replicas-{n}.yaml"
            yaml.safe_dump({"apiVersion": "apps/v1", "kind": "StatefulSet",
                            "metadata": {"name": r["name"]}, "spec": {"replicas": r["count"]}},
                           open(os.path.join(root, patch), "w"))
            k.setdefault("patchesStrategicMerge", []).append(patch)
        yaml.safe_dump(k, open(path, "w"))
    return dst


def render_all(tmp):
    minor = kubectl_minor()
    root = legacy_copy(tmp) if minor < 21 else K8S
    print(f"kubectl 1.{minor}: rendering {', '.join(TARGETS)}"
          + (" (old kustomize spelling)" if minor < 21 else ""))
    rendered = {}
    for t in TARGETS:
        out = run(["kubectl", "kustomize", os.path.join(root, t)])
        rendered[t] = [d for d in yaml.safe_load_all(out) if d]
    return rendered


# ---------------------------------------------------------------- the binaries

def binary_help():
    """flags and STAGEWISE_* variables of each binary, from --help (the CLI's
    subcommands too)."""
    info = {}
    for b in BINARIES:
        text = run([os.path.join(BIN, b), "--help"])
        if b == "stagewise":
            subs = re.findall(r"^  ([a-z][a-z-]+) {2,}", text.split("Subcommands:")[1], re.M)
            for s in subs:
                text += run([os.path.join(BIN, b), s, "--help"])
        flags = set(re.findall(r"^\s+(?:-\w,)?--([a-z][a-z0-9-]*)", text, re.M))
        flags |= set(re.findall(r",--([a-z][a-z0-9-]*)", text))
        envs = set(re.findall(r"\b(STAGEWISE_[A-Z_]+)\b", text))
        info[b] = {"flags": flags, "envs": envs}
    return info


# ---------------------------------------------------------------- checks

class Checker:
    def __init__(self, objs, helpinfo, image, secrets):
        self.objs = objs
        self.help = helpinfo
        self.image = image
        self.secrets = secrets  # {name: set(keys)} that make-secrets writes
        self.errors = []

    def err(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def find(self, kind, name=None):
        return [o for o in self.objs if o["kind"] == kind
                and (name is None or o["metadata"]["name"] == name)]

    def configmaps(self):
        return {o["metadata"]["name"]: o.get("data", {}) for o in self.find("ConfigMap")}

    def workloads(self):
        out = []
        for o in self.objs:
            if o["kind"] in ("StatefulSet", "Deployment", "Job"):
                out.append((f"{o['kind']}/{o['metadata']['name']}", o, o["spec"]["template"]))
        return out

    @staticmethod
    def parse_args(args):
        flags = {}
        for a in args:
            if a.startswith("--"):
                k, _, v = a[2:].partition("=")
                flags.setdefault(k, []).append(v)
        return flags

    def container_env(self, c):
        """The container's environment: envFrom ConfigMaps, then env."""
        env = {}
        cms = self.configmaps()
        for ef in c.get("envFrom", []):
            ref = ef.get("configMapRef", {}).get("name")
            if ref is not None:
                if ref not in cms:
                    self.err(c["name"], f"envFrom ConfigMap {ref} is not part of this rendering")
                env.update(cms.get(ref, {}))
        for e in c.get("env", []):
            env[e["name"]] = e.get("value", e.get("valueFrom"))
        return env

    @staticmethod
    def mount_for(c, pod, path):
        """(volume, key inside it) of the mount holding `path`, or None."""
        best = None
        for m in c.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                if best is None or len(mp) > len(best[0]["mountPath"].rstrip("/")):
                    best = (m, path[len(mp) + 1:])
        if best is None:
            return None
        vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        return vols.get(best[0]["name"], {"name": best[0]["name"]}), best[1], best[0]

    def check_secret_file(self, where, c, pod, path, what):
        found = self.mount_for(c, pod, path)
        if found is None or "secret" not in found[0]:
            self.err(where, f"{what} {path} is not in a mounted Secret")
            return
        vol, key, _ = found
        name = vol["secret"]["secretName"]
        if name not in self.secrets:
            self.err(where, f"{what} {path}: Secret {name} is not one make-secrets makes")
        elif key not in self.secrets[name]:
            self.err(where, f"{what} {path}: Secret {name} has no key {key} "
                            f"(it has {sorted(self.secrets[name])})")

    def check(self, gpu=False):
        services = {o["metadata"]["name"]: o for o in self.find("Service")}
        for o in self.objs:
            labels = o["metadata"].get("labels", {})
            if labels.get("app.kubernetes.io/name") != "stagewise" or \
                    labels.get("app.kubernetes.io/part-of") != "stagewise":
                self.err(f"{o['kind']}/{o['metadata']['name']}",
                         "labels app.kubernetes.io/name and part-of must be stagewise")
        for where, wl, pod in self.workloads():
            self.check_pod(where, wl, pod, services, gpu)
        for name, svc in services.items():
            self.check_service(name, svc)
        for pdb in self.find("PodDisruptionBudget"):
            sel = pdb["spec"]["selector"]["matchLabels"]
            if not any(self.selects(sel, pod) for _, _, pod in self.workloads()):
                self.err(f"PodDisruptionBudget/{pdb['metadata']['name']}", "selects no pods")
        self.check_network_policy()
        return self.errors

    def check_network_policy(self):
        """Worker pods: other workers reach the gRPC port and gloo's ephemeral
        ports; metrics and health stay reachable."""
        workers = [pod for w, _, pod in self.workloads() if w == "StatefulSet/stagewise-worker"]
        if not workers:
            return
        pod = workers[0]
        named = {p["name"]: p["containerPort"]
                 for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        policies = [n for n in self.find("NetworkPolicy")
                    if self.selects(n["spec"]["podSelector"].get("matchLabels", {}), pod)]
        if not policies:
            self.err("NetworkPolicy", "no NetworkPolicy selects the worker pods")
            return

        def allowed(port, from_pod):
            for n in policies:
                for rule in n["spec"].get("ingress", []):
                    froms = rule.get("from")
                    if froms is not None and not any(
                            "podSelector" in f and "namespaceSelector" not in f and
                            self.selects(f["podSelector"].get("matchLabels", {}), from_pod)
                            for f in froms):
                        continue
                    ports = rule.get("ports")
                    if ports is None:
                        return True
                    for p in ports:
                        lo = named.get(p["port"], p["port"])
                        hi = p.get("endPort", lo)
                        if isinstance(lo, int) and lo <= port <= hi:
                            return True
            return False

        stranger = {"metadata": {"labels": {"app": "elsewhere"}}}
        where = f"NetworkPolicy/{policies[0]['metadata']['name']}"
        if not allowed(named.get("grpc", -1), pod):
            self.err(where, "workers cannot reach each other's grpc port")
        if not all(allowed(p, pod) for p in EPHEMERAL):
            self.err(where, f"workers cannot reach each other's ephemeral ports {EPHEMERAL[0]}-"
                            f"{EPHEMERAL[1]} (gloo's collective connections)")
        if allowed(named.get("grpc", -1), stranger) or allowed(EPHEMERAL[0], stranger):
            self.err(where, "pods other than workers reach the grpc or collective ports")
        for name in ("metrics", "health"):
            if not allowed(named.get(name, -1), stranger):
                self.err(where, f"the {name} port is closed to Prometheus and the kubelet")

    @staticmethod
    def selects(selector, pod):
        labels = pod["metadata"].get("labels", {})
        return all(labels.get(k) == v for k, v in selector.items())

    def check_service(self, name, svc):
        pods = [(w, wl, pod) for w, wl, pod in self.workloads()
                if self.selects(svc["spec"].get("selector", {}), pod)]
        if not pods:
            self.err(f"Service/{name}", "its selector matches no pod template")
            return
        for _, _, pod in pods:
            ports = {p.get("name"): p["containerPort"]
                     for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            for p in svc["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                if isinstance(tp, str) and tp not in ports:
                    self.err(f"Service/{name}", f"targetPort {tp} is no container port")
                elif isinstance(tp, int) and tp not in ports.values():
                    self.err(f"Service/{name}", f"targetPort {tp} is no container port")

    def check_pod(self, where, wl, pod, services, gpu):
        spec = pod["spec"]
        sc = spec.get("securityContext", {})
        if sc.get("runAsNonRoot") is not True or sc.get("runAsUser") != 10001:
            self.err(where, "pod must run as non-root uid 10001 (the image's user)")
        if not self.selects(wl["spec"].get("selector", {}).get("matchLabels", {}), pod) \
                and wl["kind"] != "Job":
            self.err(where, "selector does not match the pod template's labels")
        for c in spec["containers"]:
            self.check_container(f"{where} container {c['name']}", wl, pod, c, services, gpu)

    def check_container(self, where, wl, pod, c, services, gpu):
        cmd = (c.get("command") or [None])[0]
        if cmd not in BINARIES:
            self.err(where, f"command {c.get('command')} is not one of {BINARIES}")
            return
        helpinfo = self.help[cmd]
        args = c.get("args", [])
        flags = self.parse_args(args)
        for f in flags:
            if f not in helpinfo["flags"]:
                self.err(where, f"--{f} is not a flag of {cmd} (see {cmd} --help)")
        env = self.container_env(c)
        own_env = {e["name"] for e in c.get("env", [])}
        for name in own_env:
            if name.startswith("STAGEWISE_"):
                if name not in helpinfo["envs"]:
                    self.err(where, f"env {name} is not read by {cmd}")
            elif f"$({name})" not in " ".join(args):
                self.err(where, f"env {name} is set but no argument uses $({name})")
        for ref in re.findall(r"\$\((\w+)\)", " ".join(args)):
            if ref not in env:
                self.err(where, f"argument uses $({ref}), which is not in the environment")
        # The image.
        want = self.image
        if gpu and cmd == "stagewise-worker":
            want = self.image + "-cuda"
        if c.get("image") != want:
            self.err(where, f"image {c.get('image')}, expected {want} (deploy/image/build)")
        # Read-only root; writable paths are volumes.
        csc = c.get("securityContext", {})
        if csc.get("readOnlyRootFilesystem") is not True or \
                csc.get("allowPrivilegeEscalation") is not False:
            self.err(where, "needs readOnlyRootFilesystem: true and allowPrivilegeEscalation: false")
        writable = []
        for f in ("db", "profile-cache"):
            writable += [(f"--{f}", v) for v in flags.get(f, [])]
        for path_flag, path in writable:
            found = self.mount_for(c, pod, path)
            if found is None or found[2].get("readOnly"):
                self.err(where, f"{path_flag} {path} is not on a writable volume")
        if cmd != "stagewise" and self.mount_for(c, pod, "/tmp/x") is None:
            self.err(where, "/tmp is not a volume (the root file system is read-only)")
        if cmd == "stagewise-coordinator" and wl["kind"] == "StatefulSet":
            claims = {t["metadata"]["name"] for t in wl["spec"].get("volumeClaimTemplates", [])}
            for db in flags.get("db", []):
                found = self.mount_for(c, pod, db)
                if found is None or found[2]["name"] not in claims:
                    self.err(where, f"--db {db} is not on a PersistentVolumeClaim")
            if wl["spec"].get("replicas") != 1:
                self.err(where, "the coordinator must have exactly one replica")
        # TLS: every process verifies STAGEWISE_TLS_SERVER_NAME, with files
        # from mounted Secrets.
        for var, what in (("STAGEWISE_TLS_CERT", "certificate"), ("STAGEWISE_TLS_KEY", "key"),
                          ("STAGEWISE_TLS_CA", "CA")):
            path = env.get(var)
            if not isinstance(path, str):
                self.err(where, f"{var} is not set (mutual TLS needs cert, key and CA)")
            else:
                self.check_secret_file(where, c, pod, path, what)
        if env.get("STAGEWISE_INSECURE") or "insecure" in flags:
            self.err(where, "runs --insecure")
        if cmd == "stagewise-coordinator":
            for t in flags.get("tokens", [None]):
                if t is None:
                    self.err(where, "the coordinator has no --tokens (every client would be admin)")
                else:
                    self.check_secret_file(where, c, pod, t, "--tokens")
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] not in self.secrets.get(ref["name"], set()):
                self.err(where, f"env {e['name']}: make-secrets makes no {ref['name']}/{ref['key']}")
        # Ports and probes of the servers.
        if cmd in ("stagewise-coordinator", "stagewise-worker"):
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for f, pname in (("listen", "grpc"), ("metrics-listen", "metrics"),
                             ("health-listen", "health")):
                vals = flags.get(f, [])
                if len(vals) != 1 or not re.match(r"^0\.0\.0\.0:\d+$", vals[0]):
                    self.err(where, f"needs one --{f}=0.0.0.0:PORT (got {vals})")
                    continue
                port = int(vals[0].rsplit(":", 1)[1])
                if ports.get(pname) != port:
                    self.err(where, f"container port {pname} is {ports.get(pname)}, "
                                    f"but --{f} listens on {port}")
            health = flags.get("health-listen", ["0.0.0.0:0"])[0].rsplit(":", 1)[1]
            for probe in ("readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if p is None or "grpc" not in p:
                    self.err(where, f"no gRPC {probe}")
                elif str(p["grpc"]["port"]) != health:
                    self.err(where, f"{probe} checks port {p['grpc']['port']}, "
                                    f"but --health-listen is on {health}")
        if cmd in ("stagewise-worker", "stagewise"):
            coord = env.get("STAGEWISE_COORDINATOR")
            host, _, port = str(coord).partition(":")
            svc = services.get(host)
            if svc is None:
                self.err(where, f"STAGEWISE_COORDINATOR {coord} names no Service here")
            else:
                coords = [c2 for _, _, p in self.workloads() if self.selects(svc["spec"]["selector"], p)
                          for c2 in p["spec"]["containers"]
                          if (c2.get("command") or [None])[0] == "stagewise-coordinator"]
                sp = [p for p in svc["spec"]["ports"] if str(p["port"]) == port]
                listen = [self.parse_args(c2.get("args", [])).get("listen", [""])[0].rsplit(":", 1)[-1]
                          for c2 in coords]
                if not coords or not sp:
                    self.err(where, f"STAGEWISE_COORDINATOR {coord}: Service {host} has no "
                                    f"port {port} to a coordinator")
                elif listen != [port] and sp[0].get("targetPort") not in ("grpc", int(listen[0] or 0)):
                    self.err(where, f"STAGEWISE_COORDINATOR {coord} does not reach --listen {listen}")
        if cmd == "stagewise-worker":
            svc_name = wl["spec"].get("serviceName")
            svc = services.get(svc_name)
            if wl["kind"] != "StatefulSet" or svc is None or svc["spec"].get("clusterIP") != "None":
                self.err(where, "workers need a StatefulSet with a headless Service (serviceName)")
            elif not self.selects(svc["spec"]["selector"], pod):
                self.err(where, f"headless Service {svc_name} does not select the workers")
            if flags.get("advertise") != [f"$(POD_NAME).{svc_name}"]:
                self.err(where, f"--advertise must be $(POD_NAME).{svc_name} (the pod's name in "
                                f"its headless Service), got {flags.get('advertise')}")
            if flags.get("name") != ["$(POD_NAME)"]:
                self.err(where, "--name must be $(POD_NAME) (a restarted pod is the same worker)")
            pod_name = [e for e in c.get("env", []) if e["name"] == "POD_NAME"]
            if not pod_name or pod_name[0].get("valueFrom", {}).get("fieldRef", {}).get(
                    "fieldPath") != "metadata.name":
                self.err(where, "POD_NAME must come from fieldRef metadata.name")
            limits = c.get("resources", {}).get("limits", {})
            if gpu:
                if int(limits.get("nvidia.com/gpu", 0)) < 1:
                    self.err(where, "gpu overlay: no nvidia.com/gpu limit")
                if flags.get("device") != ["cuda:0"]:
                    self.err(where, "gpu overlay: the worker must run --device=cuda:0")
                if not any(t.get("key") == "nvidia.com/gpu" for t in pod["spec"].get("tolerations", [])):
                    self.err(where, "gpu overlay: no toleration for nvidia.com/gpu")
            elif "nvidia.com/gpu" in limits or flags.get("device", ["cpu"]) != ["cpu"]:
                self.err(where, "cpu overlay asks for a GPU")


# ---------------------------------------------------------------- secrets

def make_secrets(tmp):
    out = os.path.join(tmp, "secrets")
    run([os.path.join(K8S, "make-secrets"), out])
    docs = [d for d in yaml.safe_load_all(open(os.path.join(out, "secrets.yaml"))) if d]
    return out, docs


def check_certificates(out, server_name):
    errors = []
    ca = os.path.join(out, "ca.pem")
    for who in ("coordinator", "worker", "client"):
        pem = os.path.join(out, f"{who}.pem")
        v = subprocess.run(["openssl", "verify", "-CAfile", ca, "-purpose", "sslserver", pem],
                           capture_output=True, text=True)
        v2 = subprocess.run(["openssl", "verify", "-CAfile", ca, "-purpose", "sslclient", pem],
                            capture_output=True, text=True)
        if v.returncode or v2.returncode:
            errors.append(f"make-secrets: {who}.pem does not verify as server and client: "
                          f"{v.stdout}{v.stderr}{v2.stderr}")
        h = subprocess.run(["openssl", "x509", "-in", pem, "-noout", "-checkhost", server_name],
                           capture_output=True, text=True)
        if "does match" not in h.stdout:
            errors.append(f"make-secrets: {who}.pem is not valid for {server_name}: {h.stdout}")
        subj = run(["openssl", "x509", "-in", pem, "-noout", "-subject", "-nameopt", "RFC2253"])
        if f"CN={who}" not in subj:
            errors.append(f"make-secrets: {who}.pem has subject {subj.strip()}, expected CN={who}")
    tokens = open(os.path.join(out, "tokens")).read()
    client = open(os.path.join(out, "client-token")).read().strip()
    if not re.search(rf"^{client} submit \S+$", tokens, re.M):
        errors.append("make-secrets: client-token is not a token of role submit in tokens")
    return errors


# ---------------------------------------------------------------- monitoring

def check_monitoring(objs, servicemonitor):
    """deploy/prometheus finds every server: prometheus.yml keeps pods with
    app.kubernetes.io/name=stagewise and a container port named metrics; the
    ServiceMonitor scrapes the port named metrics of the Services it selects."""
    errors = []
    text = open(os.path.join(SRC, "deploy/prometheus/prometheus.yml")).read()
    for needed in ("__meta_kubernetes_pod_label_app_kubernetes_io_name",
                   "__meta_kubernetes_pod_container_port_name"):
        if needed not in text:
            errors.append(f"prometheus.yml: no relabelling on {needed}")
    sm = servicemonitor[0]
    sel = sm["spec"]["selector"]["matchLabels"]
    port = sm["spec"]["endpoints"][0]["port"]
    services = [o for o in objs if o["kind"] == "Service" and Checker.selects(sel, o)]
    for o in objs:
        if o["kind"] != "StatefulSet":
            continue
        pod = o["spec"]["template"]
        name = o["metadata"]["name"]
        if pod["metadata"]["labels"].get("app.kubernetes.io/name") != "stagewise":
            errors.append(f"{name}: pods lack app.kubernetes.io/name=stagewise (prometheus.yml keeps only those)")
        ports = [p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])]
        if "metrics" not in ports:
            errors.append(f"{name}: no container port named metrics (prometheus.yml scrapes only those)")
        if not any(Checker.selects(s["spec"]["selector"], pod)
                   and any(p.get("name") == port for p in s["spec"]["ports"]) for s in services):
            errors.append(f"{name}: no Service the ServiceMonitor selects has a port {port} to it")
    return errors


# ---------------------------------------------------------------- examples

def check_examples(rendered, tmp):
    errors = []
    # Checkpoints, in both overlays: the job's checkpoint.dir under
    # --checkpoint-root, a ReadWriteMany claim mounted there on every process;
    # the coordinator (one pod) under a budget that allows no eviction.
    job = yaml.safe_load(open(os.path.join(K8S, "examples/submit/jobs/quickstart-checkpointed.yaml")))
    ckpt = job.get("checkpoint", {}).get("dir", "")
    for target in ("overlays/cpu", "overlays/gpu"):
        objs = rendered[target]
        cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
        root = cms.get("stagewise-config", {}).get("STAGEWISE_CHECKPOINT_ROOT")
        if not root or not ckpt.startswith(root.rstrip("/") + "/"):
            errors.append(f"{target}: checkpoint.dir {ckpt} is not under "
                          f"STAGEWISE_CHECKPOINT_ROOT {root}")
        claims = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
        for o in objs:
            if o["kind"] != "StatefulSet":
                continue
            pod = o["spec"]["template"]
            c = pod["spec"]["containers"][0]
            found = Checker.mount_for(c, pod, ckpt)
            claim = found and found[0].get("persistentVolumeClaim", {}).get("claimName")
            if not claim or claim not in claims or found[2].get("readOnly"):
                errors.append(f"{target}: {o['metadata']['name']} does not mount "
                              f"{ckpt} writable from a claim of this overlay")
            elif "ReadWriteMany" not in claims[claim]["spec"]["accessModes"]:
                errors.append(f"{target}: claim {claim} is not ReadWriteMany")
        coordinator = [o for o in objs if o["kind"] == "StatefulSet"
                       and o["metadata"]["name"] == "stagewise-coordinator"][0]
        labels = coordinator["spec"]["template"]["metadata"]["labels"]
        budgets = [o for o in objs if o["kind"] == "PodDisruptionBudget"
                   and all(labels.get(k) == v
                           for k, v in o["spec"]["selector"]["matchLabels"].items())]
        if len(budgets) != 1 or budgets[0]["spec"].get("maxUnavailable") != 0:
            errors.append(f"{target}: the coordinator needs one PodDisruptionBudget with "
                          f"maxUnavailable 0, found {[b['metadata']['name'] for b in budgets]}")
    # Submit: the Job's job file is in its ConfigMap and every job file there
    # passes `stagewise validate`.
    objs = rendered["examples/submit"]
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    jobs = [o for o in objs if o["kind"] == "Job"]
    if len(jobs) != 1:
        errors.append("examples/submit: expected one Job")
        return errors
    pod = jobs[0]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    args = c.get("args", [])
    if c.get("command") != ["stagewise"] or len(args) < 2 or args[0] != "submit":
        errors.append(f"examples/submit: the Job must run `stagewise submit FILE`, not {args}")
        return errors
    found = Checker.mount_for(c, pod, args[-1])
    cm = found and found[0].get("configMap", {}).get("name")
    if not cm or found[1] not in cms.get(cm, {}):
        errors.append(f"examples/submit: {args[-1]} is not a file of a ConfigMap mounted there")
    for name, text in cms.get(cm, {}).items():
        path = os.path.join(tmp, name)
        open(path, "w").write(text)
        v = subprocess.run([os.path.join(BIN, "stagewise"), "validate", path],
                           capture_output=True, text=True)
        if v.returncode:
            errors.append(f"examples/submit: stagewise validate {name}: {v.stderr.strip()}")
    # Replicated: the worker StatefulSet has stages.count x stages.replicas
    # pods for the job file the Job submits.
    objs = rendered["examples/replicated"]
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    sts = [o for o in objs if o["kind"] == "StatefulSet" and
           o["metadata"]["name"] == "stagewise-worker"]
    jobs = [o for o in objs if o["kind"] == "Job"]
    if len(sts) != 1 or len(jobs) != 1:
        errors.append("examples/replicated: expected the worker StatefulSet and one Job")
        return errors
    pod = jobs[0]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    found = Checker.mount_for(c, pod, c.get("args", [""])[-1])
    cm = found and found[0].get("configMap", {}).get("name")
    text = found and cms.get(cm, {}).get(found[1])
    if not text:
        errors.append(f"examples/replicated: the Job's {c.get('args')} is no mounted job file")
        return errors
    stages = yaml.safe_load(text).get("stages", {})
    count, replicas = (stages, 1) if isinstance(stages, int) else (
        stages.get("count", 0), stages.get("replicas", 1))
    if replicas < 2:
        errors.append(f"examples/replicated: {found[1]} has stages.replicas {replicas}")
    if sts[0]["spec"]["replicas"] != count * replicas:
        errors.append(f"examples/replicated: {sts[0]['spec']['replicas']} workers for a job of "
                      f"{count} stages x {replicas} replicas")
    return errors


# ---------------------------------------------------------------- breakages

def first(objs, kind, name):
    return [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name][0]


def worker_container(objs):
    return first(objs, "StatefulSet", "stagewise-worker")["spec"]["template"]["spec"]["containers"][0]


def breakages():
    def probe(objs):
        worker_container(objs)["readinessProbe"]["grpc"]["port"] = 8082

    def flag(objs):
        worker_container(objs)["args"].append("--bogus-flag=1")

    def advertise(objs):
        c = worker_container(objs)
        c["args"] = [("--advertise=$(POD_NAME).elsewhere" if a.startswith("--advertise") else a)
                     for a in c["args"]]

    def secret(objs):
        c = worker_container(objs)
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "tls"]

    def image(objs):
        worker_container(objs)["image"] = "docker.io/library/stagewise:latest"

    def service_port(objs):
        first(objs, "Service", "stagewise-coordinator")["spec"]["ports"][1]["targetPort"] = "metric"

    def env(objs):
        worker_container(objs)["env"].append({"name": "STAGEWISE_DATAROOT", "value": "/data"})

    def listen(objs):
        c = worker_container(objs)
        c["args"] = [("--listen=0.0.0.0:7072" if a.startswith("--listen") else a) for a in c["args"]]

    def network_policy(objs):
        rule = first(objs, "NetworkPolicy", "stagewise-worker")["spec"]["ingress"][0]
        rule["ports"] = [p for p in rule["ports"] if "endPort" not in p]

    return {"probe on another port": probe, "unknown flag": flag,
            "advertised name outside the headless Service": advertise,
            "certificate Secret not mounted": secret, "another image": image,
            "Service targetPort without a container port": service_port,
            "misspelt STAGEWISE_ variable": env, "--listen off its container port": listen,
            "NetworkPolicy without gloo's ports": network_policy}


# ---------------------------------------------------------------- main

def main():
    for tool in ("kubectl", "node", "openssl"):
        if shutil.which(tool) is None:
            skip(f"{tool} not found (scripts/setup installs it)")
    if not os.path.isdir(os.path.join(VALIDATOR_DIR, "node_modules", "kubernetes-models")):
        skip("tests/deploy/k8s/node_modules is missing (scripts/setup runs npm ci there)")
    errors = []
    with tempfile.TemporaryDirectory(prefix="stagewise_k8s_") as tmp:
        rendered = render_all(tmp)
        secrets_dir, secret_docs = make_secrets(tmp)
        secrets = {d["metadata"]["name"]: set(d.get("data", {})) for d in secret_docs}
        monitoring = rendered["overlays/monitoring"]
        servicemonitor = [o for o in monitoring if o["kind"] == "ServiceMonitor"]
        kinds = sorted({o["kind"] for o in monitoring})
        if kinds != ["ConfigMap", "PrometheusRule", "ServiceMonitor"]:
            errors.append(f"overlays/monitoring: renders {kinds}, expected ConfigMap, "
                          f"PrometheusRule and ServiceMonitor")

        everything = [o for t in TARGETS for o in rendered[t]] + secret_docs
        v = subprocess.run(["node", os.path.join(VALIDATOR_DIR, "validate.js")],
                           input=json.dumps(everything), capture_output=True, text=True,
                           cwd=VALIDATOR_DIR)
        print(v.stderr.strip())
        if v.returncode:
            errors += [f"schema: {line}" for line in v.stdout.splitlines()]

        helpinfo = binary_help()
        image = run([os.path.join(SRC, "deploy/image/build"), "--print-name"]).strip()
        for t in ("overlays/cpu", "overlays/gpu"):
            found = Checker(rendered[t], helpinfo, image, secrets).check(gpu=t.endswith("gpu"))
            errors += [f"{t}: {e}" for e in found]
            print(f"{t}: {len(rendered[t])} objects, {len(found)} problems")
        submit = rendered["examples/submit"] + rendered["overlays/cpu"]
        found = [e for e in Checker(submit, helpinfo, image, secrets).check()
                 if e.startswith("Job/")]
        errors += [f"examples/submit: {e}" for e in found]
        server_name = [o for o in rendered["overlays/cpu"] if o["kind"] == "ConfigMap"][0][
            "data"]["STAGEWISE_TLS_SERVER_NAME"]
        errors += check_certificates(secrets_dir, server_name)
        errors += check_monitoring(rendered["overlays/cpu"], servicemonitor)
        monitoring_checks.init(SRC)
        found = monitoring_checks.check(monitoring)
        errors += [f"overlays/monitoring: {e}" for e in found]
        print(f"overlays/monitoring: {len(monitoring)} objects, {len(found)} problems")
        errors += check_examples(rendered, tmp)

        caught = 0
        for what, breakage in breakages().items():
            objs = copy.deepcopy(rendered["overlays/cpu"])
            breakage(objs)
            found = Checker(objs, helpinfo, image, secrets).check()
            if found:
                caught += 1
                print(f"breakage '{what}' is caught: {found[0]}")
            else:
                errors.append(f"self-test: the breakage '{what}' went unnoticed")
        before = set(monitoring_checks.check(monitoring))
        for what, (breakage, says) in monitoring_checks.breakages().items():
            objs = copy.deepcopy(monitoring)
            breakage(objs)
            found = [e for e in monitoring_checks.check(objs) if e not in before and says in e]
            if found:
                caught += 1
                print(f"breakage '{what}' is caught: {found[0]}")
            else:
                errors.append(f"self-test: the breakage '{what}' went unnoticed "
                              f"(no new report saying '{says}')")
        total = len(breakages()) + len(monitoring_checks.breakages())
        print(f"{caught} of {total} breakages caught")

    for e in errors:
        print("FAIL:", e)
    if errors:
        sys.exit(1)
    print("ok: every overlay renders, validates and matches the binaries")


if __name__ == "__main__":
    main()
