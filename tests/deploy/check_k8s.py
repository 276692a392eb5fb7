#!/usr/bin/env python3
"""ctest -L deploy: the Kubernetes manifests of deploy/k8s.

  check_k8s.py SOURCE_DIR BINARY_DIR

1. `kubectl kustomize` renders the base, the cpu, gpu and monitoring
   overlays, the examples and the gpu overlay with the checkpoints component,
   offline.
2. Every rendered object (the monitoring overlay's ServiceMonitor and
   PrometheusRule included) and the Secrets deploy/k8s/make-secrets writes
   validate against the Kubernetes API schema (kubernetes-models and its
   Prometheus Operator models, tests/deploy/k8s/validate.js).
3. Structural checks against the real binaries (BINARY_DIR/bin): every flag
   and STAGEWISE_* variable a container is given appears in that binary's
   --help; startup, readiness and liveness probes point at the
   --health-listen port, the startup probe allowing more than liveness;
   container and Service ports match --listen and --metrics-listen; a worker
   advertises $(POD_NAME).<its headless Service>; the coordinator address
   names the coordinator's Service and port; every TLS, CA and token path
   (--tls-* or STAGEWISE_TLS_*, $(POD_NAME) expanded for each pod of a
   StatefulSet) lies in a mounted Secret that holds that key, and each worker
   pod reads a certificate of its own (make-secrets makes every Secret and
   key the manifests use, with certificates that verify against the CA for
   the name the manifests verify, CN worker-<pod> on the workers'); writable
   paths are volumes under a read-only root; images are the ones
   deploy/image/build makes; the gpu overlay asks for a GPU and runs cuda:0;
   every claim binds on a plain ReadWriteOnce default StorageClass, but the
   checkpoints component's ReadWriteMany one, in the targets that include the
   component only, where the checkpointed job saves under it mounted at
   --checkpoint-root on every process; the coordinator has a budget that
   allows no eviction; the submit example's job files pass `stagewise
   validate`; the replicated example sizes the worker StatefulSet
   stages.count x stages.replicas of the job it submits; the workers'
   NetworkPolicy lets workers (and only them) reach the gRPC port and gloo's
   ephemeral ports, the coordinator's lets the stagewise pods (and only them)
   reach its gRPC port, and both leave metrics, health (and the status pages)
   open; no kustomization uses deprecated fields (commonLabels, bases, ...).
   The monitoring overlay (monitoring_checks.py): the ServiceMonitor has the
   `release` label, honours no labels and maps exported_job to job_id
   (prometheus.yml too); the PrometheusRule holds the rules file's groups,
   StagewiseCoordinatorDown and a runbook_url on every alert that is the
   overlay's runbook_base followed by a section of deploy/README.md; every
   dashboard is a ConfigMap with the sidecar label holding the very file.
4. The walkthrough of deploy/README.md as it types it: its commands (the
   sh blocks of "From an empty cluster to a finished job", in order, and
   each alternative a `# or ...` comment offers) run against a model of the
   cluster: make-secrets for real (with its WORKERS=...), `kubectl apply -k`
   renders the directory, `-f` reads secrets.yaml. After each apply every
   claim binds as in 3, every worker pod of the StatefulSet finds its own
   certificate in the Secret (openssl: its Common Name a worker identity, its
   key the certificate's, signed by the CA the pod trusts) and no two pods
   share an identity, and each job submitted (the submit Jobs' job files,
   `stagewise submit FILE`) can be placed: enough worker pods of distinct
   identities for stages x replicas (placement.distinct_identities is true
   unless the job says otherwise), checkpoint.dir under a mounted
   ReadWriteMany --checkpoint-root.
5. The checks can fail: known breakages of the rendered cpu overlay (a probe
   on the wrong port, an unknown flag, another advertised name, a missing
   Secret mount, a wrong image, a Service port without a container port, a
   misspelt variable, a listen port, NetworkPolicies without gloo's ports or
   with the coordinator's gRPC port open, no startup probe, one certificate
   file for every worker pod), of the monitoring overlay (no `release` label,
   labels honoured, no job_id relabelling, an alert without runbook, a
   runbook without its base or anchor, a dashboard without the sidecar label
   or unlike its file) and of the walkthrough (one worker certificate shared
   by every pod, a ReadWriteMany claim in the base, the replicated example
   without WORKERS=4) must each be reported.

With kubectl <= 1.20 (kustomize 2.0.3) the copy of deploy/ it renders is
rewritten in that kustomize's spelling (legacy_copy). Exit 77 (skipped)
without kubectl, node or the validator's node_modules (scripts/setup
installs them).
"""
import base64
import copy
import hashlib
import json
import os
import re
import shlex
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
# The gpu overlay with the checkpoints component: a kustomization the test
# writes (deploy/k8s/<name>, in its copy of deploy/).
SYNTHETIC = {"tests/gpu-checkpoints": {
    "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
    "resources": ["../../overlays/gpu"], "components": ["../../components/checkpoints"]}}
TARGETS = ("base", "overlays/cpu", "overlays/gpu", "overlays/monitoring",
           "examples/submit", "examples/replicated", "examples/checkpointed",
           "tests/gpu-checkpoints")
CHECKPOINTS = "components/checkpoints"  # the opt-in ReadWriteMany volume
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


def legacy_kustomization(root, k, dst, replacements):
    """One kustomization.yaml `k` of directory `root` in kustomize 2.0.3's
    spelling (see legacy_copy)."""
    # Components (kustomize 3.7): their resources and patches, copied into
    # this directory (2.0.3 loads files only from below a kustomization).
    for n, comp in enumerate(k.pop("components", [])):
        src = os.path.normpath(os.path.join(root, comp))
        ck = yaml.safe_load(open(os.path.join(src, "kustomization.yaml")))
        unknown = set(ck) - {"apiVersion", "kind", "resources", "patches"}
        if unknown:
            raise SystemExit(f"legacy_copy: component {comp}: {sorted(unknown)} not emulated")
        sub = f"legacy-component-{n}"
        shutil.copytree(src, os.path.join(root, sub))
        k.setdefault("resources", []).extend(f"{sub}/{r}" for r in ck.get("resources", []))
        k.setdefault("patches", []).extend({"path": f"{sub}/{p['path']}"}
                                           for p in ck.get("patches", []))
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
    # `labels:` (kustomize 4.1) as commonLabels, which 2.0.3 puts on the
    # selectors of the kinds it knows only (none in the objects labelled so).
    for entry in k.pop("labels", []):
        k.setdefault("commonLabels", {}).update(entry.get("pairs", {}))
    # `replacements:` (kustomize 4) and the local-config ConfigMaps they read
    # (kustomize 4 leaves those out of the output): applied by
    # apply_replacements after rendering.
    if "replacements" in k:
        sources = {}
        keep = []
        for g in k.get("configMapGenerator", []):
            if g.get("options", {}).get("annotations", {}).get(
                    "config.kubernetes.io/local-config") == "true":
                sources[g["name"]] = dict(kv.split("=", 1) for kv in g.get("literals", []))
            else:
                keep.append(g)
        k["configMapGenerator"] = keep
        if not keep:
            del k["configMapGenerator"]
        replacements[os.path.relpath(root, dst)] = (k.pop("replacements"), sources)


def legacy_copy(deploy, replacements):
    """kubectl <= 1.20 embeds kustomize 2.0.3, which takes directories in
    `bases` and strategic-merge patches in `patchesStrategicMerge`, and knows
    no components, `labels` or `replacements`. The manifests use today's
    spelling (`resources`, `patches: - path:`, `replicas:`, `components:`,
    `labels:`, `replacements:`); for an old kubectl, the copy `deploy` is
    rewritten in the old spelling (components inlined, labels as
    commonLabels, replacements left to apply_replacements)."""
    for root, _, files in os.walk(deploy):
        if "kustomization.yaml" not in files:
            continue
        path = os.path.join(root, "kustomization.yaml")
        k = yaml.safe_load(open(path))
        if k.get("kind") == "Component":
            continue  # inlined where it is used
        legacy_kustomization(root, k, os.path.join(deploy, "k8s"), replacements)
        yaml.safe_dump(k, open(path, "w"))


def field_values(obj, path):
    """(container, key) of every field `path` (dot-separated, `*` for each
    element of a list) names in obj."""
    parts = path.split(".")
    found = [(None, None, obj)]
    for part in parts:
        nxt = []
        for _, _, node in found:
            if part == "*" and isinstance(node, list):
                nxt += [(node, i, v) for i, v in enumerate(node)]
            elif isinstance(node, dict) and part in node:
                nxt.append((node, part, node[part]))
        found = nxt
    return [(c, key) for c, key, _ in found]


def apply_replacements(objs, replacements, sources):
    """kustomize's `replacements` as the manifests use them: a value of a
    local-config ConfigMap into fields of selected objects, whole or as one
    part of the value split at options.delimiter."""
    for r in replacements:
        src = r["source"]
        value = sources[src["name"]][src["fieldPath"].split(".", 1)[1]]
        for t in r["targets"]:
            sel = t["select"]
            for o in objs:
                if o["kind"] != sel.get("kind", o["kind"]) or \
                        o["metadata"]["name"] != sel.get("name", o["metadata"]["name"]):
                    continue
                for fp in t["fieldPaths"]:
                    for container, key in field_values(o, fp):
                        opts = t.get("options", {})
                        if "delimiter" in opts:
                            parts = str(container[key]).split(opts["delimiter"])
                            parts[opts.get("index", 0)] = value
                            container[key] = opts["delimiter"].join(parts)
                        else:
                            container[key] = value


class Renderer:
    """`kubectl kustomize` of deploy/k8s directories, from a copy of deploy/
    in `tmp` (with the kustomizations of SYNTHETIC added, and in kustomize
    2.0.3's spelling for an old kubectl)."""

    def __init__(self, tmp):
        self.minor = kubectl_minor()
        self.legacy = self.minor < 21
        # source/deploy: deploy/ as it is, with SYNTHETIC; deploy: what is rendered.
        source = os.path.join(tmp, "source", "deploy")
        shutil.copytree(os.path.dirname(K8S), source)
        self.source = os.path.join(source, "k8s")
        for target, k in SYNTHETIC.items():
            os.makedirs(os.path.join(self.source, target))
            yaml.safe_dump(k, open(os.path.join(self.source, target, "kustomization.yaml"), "w"))
        deploy = os.path.join(tmp, "deploy")
        shutil.copytree(source, deploy)
        self.root = os.path.join(deploy, "k8s")
        self.replacements = {}
        if self.legacy:
            legacy_copy(deploy, self.replacements)
        self.cache = {}

    def render(self, target):
        """The objects of deploy/k8s/<target>."""
        if target not in self.cache:
            try:
                out = run(["kubectl", "kustomize", os.path.join(self.root, target)])
            except subprocess.CalledProcessError as e:
                print(f"FAIL: kubectl kustomize deploy/k8s/{target}: {e.stderr.strip()}")
                sys.exit(1)
            objs = [d for d in yaml.safe_load_all(out) if d]
            for where, (replacements, sources) in self.replacements.items():
                if self.includes(target, where):
                    apply_replacements(objs, replacements, sources)
            self.cache[target] = objs
        return copy.deepcopy(self.cache[target])

    def includes(self, target, other):
        """Whether deploy/k8s/<target> builds on deploy/k8s/<other> (or is
        it), a component included."""
        return os.path.normpath(other) in kustomization_tree(target, self.source)


def kustomization_tree(target, root):
    """Every directory (relative to deploy/k8s) the kustomization of
    <root>/<target> uses, itself and its components included."""
    seen, todo = set(), [os.path.normpath(target)]
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        path = os.path.join(root, t, "kustomization.yaml")
        if not os.path.exists(path):
            continue
        k = yaml.safe_load(open(path))
        for r in k.get("resources", []) + k.get("bases", []) + k.get("components", []):
            if os.path.isdir(os.path.join(root, t, r)):
                todo.append(os.path.normpath(os.path.join(t, r)))
    return seen


RENDERER = None  # set by render_all


def render_all(tmp):
    global RENDERER
    RENDERER = Renderer(tmp)
    print(f"kubectl 1.{RENDERER.minor}: rendering {', '.join(TARGETS)}"
          + (" (old kustomize spelling)" if RENDERER.legacy else ""))
    return {t: RENDERER.render(t) for t in TARGETS}


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
    def pod_names(wl):
        """The names of a StatefulSet's pods (<name>-0, -1, ...); None for
        other workloads, whose pod names are random."""
        if wl["kind"] != "StatefulSet":
            return None
        return [f"{wl['metadata']['name']}-{i}" for i in range(wl["spec"].get("replicas", 1))]

    @staticmethod
    def expand(text, env, pod_name):
        """$(VAR) as the kubelet expands it in args: a variable of the
        downward API's metadata.name is `pod_name`, plain values of the
        environment are themselves; others stay."""
        def one(m):
            v = env.get(m.group(1))
            if isinstance(v, dict) and pod_name is not None and \
                    v.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                return pod_name
            return v if isinstance(v, str) else m.group(0)
        return re.sub(r"\$\((\w+)\)", one, text)

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

    def policy(self, pod):
        """allowed(port name, from pod) under the NetworkPolicies that select
        `pod`, or None when none does."""
        named = {p["name"]: p["containerPort"]
                 for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        policies = [n for n in self.find("NetworkPolicy")
                    if self.selects(n["spec"]["podSelector"].get("matchLabels", {}), pod)]
        if not policies:
            return None, None

        def allowed(port, from_pod):
            port = named.get(port, port)
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
                        if isinstance(lo, int) and isinstance(port, int) and lo <= port <= hi:
                            return True
            return False
        return allowed, f"NetworkPolicy/{policies[0]['metadata']['name']}"

    def check_network_policy(self):
        """Worker pods: other workers reach the gRPC port and gloo's ephemeral
        ports. The coordinator: workers and the namespace's stagewise clients
        (the submit Job) reach its gRPC port, no other pod does; the status
        pages are open. On both, metrics and health stay reachable."""
        pods = {w: pod for w, _, pod in self.workloads()}
        stranger = {"metadata": {"labels": {"app": "elsewhere"}}}
        worker = pods.get("StatefulSet/stagewise-worker")
        if worker is not None:
            allowed, where = self.policy(worker)
            if allowed is None:
                self.err("NetworkPolicy", "no NetworkPolicy selects the worker pods")
            else:
                if not allowed("grpc", worker):
                    self.err(where, "workers cannot reach each other's grpc port")
                if not all(allowed(p, worker) for p in EPHEMERAL):
                    self.err(where, f"workers cannot reach each other's ephemeral ports "
                                    f"{EPHEMERAL[0]}-{EPHEMERAL[1]} (gloo's collective connections)")
                if allowed("grpc", stranger) or allowed(EPHEMERAL[0], stranger):
                    self.err(where, "pods other than workers reach the grpc or collective ports")
                for name in ("metrics", "health"):
                    if not allowed(name, stranger):
                        self.err(where, f"the {name} port is closed to Prometheus and the kubelet")
        coordinator = pods.get("StatefulSet/stagewise-coordinator")
        if coordinator is not None:
            allowed, where = self.policy(coordinator)
            if allowed is None:
                self.err("NetworkPolicy", "no NetworkPolicy selects the coordinator pod")
            else:
                clients = [(w, pod) for w, pod in pods.items()
                           if w != "StatefulSet/stagewise-coordinator"]
                for w, pod in clients:
                    if not allowed("grpc", pod):
                        self.err(w, f"its pods cannot reach the coordinator's grpc port ({where})")
                if allowed("grpc", stranger):
                    self.err(where, "pods other than stagewise's reach the coordinator's grpc port")
                for name in ("web", "metrics", "health"):
                    if not allowed(name, stranger):
                        self.err(where, f"the coordinator's {name} port is closed")

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
        # from mounted Secrets (--tls-* take precedence over the variables),
        # for each pod of the workload; a worker's certificate is the pod's own.
        pods = self.pod_names(wl)
        paths = {}
        for flag, var, what in (("tls-cert", "STAGEWISE_TLS_CERT", "certificate"),
                                ("tls-key", "STAGEWISE_TLS_KEY", "key"),
                                ("tls-ca", "STAGEWISE_TLS_CA", "CA")):
            path = (flags.get(flag) or [env.get(var)])[-1]
            if not isinstance(path, str) or not path:
                self.err(where, f"{var} (or --{flag}) is not set (mutual TLS needs cert, key and CA)")
                continue
            if "$(" in path and pods is None:
                self.err(where, f"--{flag} {path}: a {wl['kind']}'s pod names are not known "
                                f"in advance")
                continue
            paths[flag] = {p: self.expand(path, env, p) for p in (pods or [None])}
            for p, expanded in paths[flag].items():
                self.check_secret_file(where + (f" (pod {p})" if p and "$(" in path else ""),
                                       c, pod, expanded, what)
        if cmd == "stagewise-worker" and pods and len(pods) > 1 and "tls-cert" in paths \
                and len(set(paths["tls-cert"].values())) < len(pods):
            self.err(where, f"every worker pod presents the same certificate "
                            f"{paths['tls-cert'][pods[0]]}: placement.distinct_identities "
                            f"needs one per pod (e.g. /etc/stagewise/tls/$(POD_NAME).crt)")
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
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if p is None or "grpc" not in p:
                    self.err(where, f"no gRPC {probe}")
                elif str(p["grpc"]["port"]) != health:
                    self.err(where, f"{probe} checks port {p['grpc']['port']}, "
                                    f"but --health-listen is on {health}")

            # A slow start (LibTorch, CUDA's first initialisation, a database
            # migration) has the startup probe's budget, longer than liveness'.
            def budget(p):
                return (p or {}).get("periodSeconds", 10) * (p or {}).get("failureThreshold", 3)
            if c.get("startupProbe") and budget(c["startupProbe"]) <= budget(c.get("livenessProbe")):
                self.err(where, f"the startupProbe allows {budget(c['startupProbe'])} s, no more "
                                f"than the livenessProbe's {budget(c.get('livenessProbe'))} s")
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

def make_secrets(tmp, env=None, out=None):
    """Runs deploy/k8s/make-secrets into `out` (default tmp/secrets) with the
    extra environment `env` (WORKERS=...), as a user would."""
    out = out or os.path.join(tmp, "secrets")
    e = {k: v for k, v in os.environ.items()
         if k not in ("WORKERS", "WORKER_PREFIX", "DAYS", "TLS_SERVER_NAME")}
    e.update(env or {})
    run([os.path.join(K8S, "make-secrets"), out], env=e)
    docs = [d for d in yaml.safe_load_all(open(os.path.join(out, "secrets.yaml"))) if d]
    return out, docs


def secret_data(docs):
    """{Secret name: {key: bytes}} of Secret objects."""
    return {d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d.get("data", {}).items()}
            for d in docs if d["kind"] == "Secret"}


def check_certificates(out, server_name):
    errors = []
    ca = os.path.join(out, "ca.pem")
    leaves = {"coordinator": "coordinator", "client": "client"}
    workers = sorted((f[:-4] for f in os.listdir(out) if re.match(r"stagewise-worker-\d+\.pem$", f)),
                     key=lambda p: int(p.rsplit("-", 1)[1]))
    if workers != [f"stagewise-worker-{i}" for i in range(2)]:
        errors.append(f"make-secrets: worker certificates {workers}, expected one for each of "
                      f"the base's 2 worker pods")
    leaves.update({w: f"worker-{w}" for w in workers})
    for who, cn in leaves.items():
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
        if not re.search(rf"(^|[=,]\s*)CN={re.escape(cn)}(,|$)", subj.strip().split("=", 1)[-1]):
            errors.append(f"make-secrets: {who}.pem has the subject {subj.strip().split('=', 1)[-1]}, "
                          f"expected CN={cn}")
    tokens = open(os.path.join(out, "tokens")).read()
    client = open(os.path.join(out, "client-token")).read().strip()
    if not re.search(rf"^{client} submit \S+$", tokens, re.M):
        errors.append("make-secrets: client-token is not a token of role submit in tokens")
    return errors


# ---------------------------------------------------------------- identities

def is_worker_identity(identity):
    """services/rpc/tls.cc IsWorkerIdentity: the coordinator and the workers
    accept these certificate identities (Common Names) as workers'."""
    return identity == "worker" or identity.startswith(("worker-", "worker."))


CERT_CACHE = {}


def certificate(cert, key, ca):
    """(Common Name, problem or None) of a PEM certificate, with the key the
    pod is given and the CA it trusts (openssl)."""
    digest = hashlib.sha256(cert + b"\0" + key + b"\0" + ca).hexdigest()
    if digest in CERT_CACHE:
        return CERT_CACHE[digest]
    with tempfile.TemporaryDirectory(prefix="stagewise_cert_") as d:
        paths = {}
        for name, data in (("cert", cert), ("key", key), ("ca", ca)):
            paths[name] = os.path.join(d, name)
            open(paths[name], "wb").write(data)
        subj = subprocess.run(["openssl", "x509", "-in", paths["cert"], "-noout", "-subject",
                               "-nameopt", "RFC2253"], capture_output=True, text=True)
        m = re.search(r"(?:^subject=|,)CN=((?:[^,\\]|\\.)*)", subj.stdout.strip())
        problem = None
        cn = m.group(1) if m else ""
        if subj.returncode or not m:
            problem = f"no certificate with a Common Name ({subj.stderr.strip() or subj.stdout.strip()})"
        else:
            pub = run(["openssl", "x509", "-in", paths["cert"], "-noout", "-pubkey"])
            kpub = subprocess.run(["openssl", "pkey", "-in", paths["key"], "-pubout"],
                                  capture_output=True, text=True)
            v = subprocess.run(["openssl", "verify", "-CAfile", paths["ca"], paths["cert"]],
                               capture_output=True, text=True)
            if kpub.returncode or kpub.stdout != pub:
                problem = "its key is not the certificate's"
            elif v.returncode:
                problem = f"it does not verify against the CA: {v.stdout.strip()}{v.stderr.strip()}"
    CERT_CACHE[digest] = (cn, problem)
    return cn, problem


def worker_identities(objs, secrets):
    """[(pod, identity, problem)] for every pod of every worker StatefulSet
    of `objs`: the Common Name of the certificate file the pod's container
    reads (--tls-cert, else STAGEWISE_TLS_CERT; $(POD_NAME) expanded) from
    the Secret mounted there, with `secrets` ({name: {key: bytes}}) as the
    cluster holds them."""
    out = []
    checker = Checker(objs, None, None, None)
    for wl in checker.find("StatefulSet"):
        pod = wl["spec"]["template"]
        for c in pod["spec"]["containers"]:
            if (c.get("command") or [None])[0] != "stagewise-worker":
                continue
            flags = Checker.parse_args(c.get("args", []))
            env = checker.container_env(c)
            for name in Checker.pod_names(wl):
                files, problem = {}, None
                for flag, var in (("tls-cert", "STAGEWISE_TLS_CERT"), ("tls-key", "STAGEWISE_TLS_KEY"),
                                  ("tls-ca", "STAGEWISE_TLS_CA")):
                    path = Checker.expand(str((flags.get(flag) or [env.get(var)])[-1]), env, name)
                    found = Checker.mount_for(c, pod, path)
                    if found is None or "secret" not in found[0]:
                        problem = f"{path} is in no mounted Secret"
                        break
                    secret = found[0]["secret"]["secretName"]
                    if found[1] not in secrets.get(secret, {}):
                        problem = f"{path}: the Secret {secret} has no key {found[1]}"
                        break
                    files[flag] = secrets[secret][found[1]]
                if problem is None:
                    cn, problem = certificate(files["tls-cert"], files["tls-key"], files["tls-ca"])
                    if problem is None and not is_worker_identity(cn):
                        problem = f"CN {cn} is not a worker's (worker, worker-*, worker.*)"
                    out.append((name, cn, problem))
                else:
                    out.append((name, None, problem))
    return out


def check_identities(where, objs, secrets):
    """Every worker pod starts with a certificate of its own: a worker
    identity no other pod presents."""
    errors = []
    ids = worker_identities(objs, secrets)
    seen = {}
    for pod, cn, problem in ids:
        if problem:
            errors.append(f"{where}: worker pod {pod} has no usable certificate: {problem}")
        else:
            seen.setdefault(cn, []).append(pod)
    for cn, pods in seen.items():
        if len(pods) > 1:
            errors.append(f"{where}: worker pods {', '.join(pods)} present the same certificate "
                          f"identity {cn}")
    return errors


def check_placement(where, objs, secrets, job_text, job_name):
    """Can the coordinator start this job on these pods? As many worker pods
    as the job has stages x replicas, with distinct certificate identities
    unless the job says placement.distinct_identities: false; a
    checkpoint.dir under the processes' --checkpoint-root, on a volume every
    one of them mounts there."""
    errors = []
    spec = yaml.safe_load(job_text) or {}
    stages = spec.get("stages", 1)
    count, replicas = (stages, 1) if isinstance(stages, int) else (
        stages.get("count", 1), stages.get("replicas", 1))
    need = count * replicas
    ids = [(pod, cn) for pod, cn, problem in worker_identities(objs, secrets) if problem is None]
    distinct = (spec.get("placement") or {}).get("distinct_identities", True)
    usable = len({cn for _, cn in ids}) if distinct else len(ids)
    if usable < need:
        errors.append(
            f"{where}: job {job_name} cannot be placed: it needs {need} workers"
            + (" with distinct certificate identities (placement.distinct_identities)"
               if distinct else "")
            + f", the worker pods that can start give {usable}: "
            + (", ".join(f"{pod} {cn}" for pod, cn in ids) or "none"))
    ckpt = (spec.get("checkpoint") or {}).get("dir")
    if ckpt:
        errors += check_checkpoint_dir(where, objs, ckpt, job_name)
    return errors


def check_checkpoint_dir(where, objs, ckpt, job_name):
    """checkpoint.dir lies under STAGEWISE_CHECKPOINT_ROOT, and every
    coordinator and worker pod mounts a writable ReadWriteMany claim there.
    job_name None: ckpt is a path under a root (check_checkpoint_root)."""
    errors = []
    what = f"job {job_name}: checkpoint.dir" if job_name else "checkpoint root:"
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    roots = [r for r in str(cms.get("stagewise-config", {}).get(
        "STAGEWISE_CHECKPOINT_ROOT", "")).split(":") if r]
    if not any(ckpt.startswith(r.rstrip("/") + "/") for r in roots):
        return [f"{where}: {what} {ckpt} is under no STAGEWISE_CHECKPOINT_ROOT "
                f"({roots or 'none'}): the coordinator refuses it (the checkpoints component "
                f"sets one)"]
    claims = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
    for o in objs:
        if o["kind"] != "StatefulSet":
            continue
        pod = o["spec"]["template"]
        for c in pod["spec"]["containers"]:
            found = Checker.mount_for(c, pod, ckpt)
            claim = found and found[0].get("persistentVolumeClaim", {}).get("claimName")
            if not claim or claim not in claims or found[2].get("readOnly"):
                errors.append(f"{where}: {what} {ckpt}: {o['metadata']['name']} does not mount "
                              f"it writable from a claim")
            elif "ReadWriteMany" not in claims[claim]["spec"]["accessModes"]:
                errors.append(f"{where}: {what} {ckpt}: the claim {claim} there is not "
                              f"ReadWriteMany (every pod mounts it)")
    return errors


# ---------------------------------------------------------------- claims

def component_claims():
    """The PersistentVolumeClaims the checkpoints component adds."""
    root = os.path.join(K8S, CHECKPOINTS)
    k = yaml.safe_load(open(os.path.join(root, "kustomization.yaml")))
    names = set()
    for r in k.get("resources", []):
        for d in yaml.safe_load_all(open(os.path.join(root, r))):
            if d and d["kind"] == "PersistentVolumeClaim":
                names.add(d["metadata"]["name"])
    return names


def check_claims(target, objs, with_checkpoints):
    """Every claim a pod needs is made here and binds on a plain default
    StorageClass: ReadWriteOnce, no storageClassName, no selector or data
    source, a file system. Only the checkpoints component's claims may ask for
    ReadWriteMany, and only where the target includes the component."""
    errors = []
    allowed_rwx = component_claims() if with_checkpoints else set()
    claims = {o["metadata"]["name"]: (o["spec"], "PersistentVolumeClaim")
              for o in objs if o["kind"] == "PersistentVolumeClaim"}
    for o in objs:
        if o["kind"] == "StatefulSet":
            for t in o["spec"].get("volumeClaimTemplates", []):
                claims[f"{t['metadata']['name']}-{o['metadata']['name']}-N"] = (
                    t["spec"], f"volumeClaimTemplate of {o['metadata']['name']}")
        if o["kind"] in ("StatefulSet", "Deployment", "Job"):
            for v in o["spec"]["template"]["spec"].get("volumes", []):
                name = v.get("persistentVolumeClaim", {}).get("claimName")
                if name and name not in claims:
                    errors.append(f"{target}: {o['kind']}/{o['metadata']['name']} mounts the claim "
                                  f"{name}, which is not made here (its pods would stay Pending)")
    for name, (spec, what) in claims.items():
        modes = spec.get("accessModes", [])
        if name in allowed_rwx:
            if "ReadWriteMany" not in modes:
                errors.append(f"{target}: {what} {name}: the checkpoints component's claim must "
                              f"be ReadWriteMany (every pod mounts it)")
            continue
        problems = []
        if modes != ["ReadWriteOnce"]:
            problems.append(f"accessModes {modes} (a default class binds ReadWriteOnce)")
        for field in ("storageClassName", "selector", "dataSource", "dataSourceRef", "volumeName"):
            if field in spec:
                problems.append(f"{field} {spec[field]!r} (the default class provisions it)")
        if spec.get("volumeMode", "Filesystem") != "Filesystem":
            problems.append(f"volumeMode {spec['volumeMode']}")
        if problems:
            errors.append(f"{target}: {what} {name} does not bind on a plain ReadWriteOnce "
                          f"default StorageClass: {'; '.join(problems)}"
                          + ("" if with_checkpoints else
                             " (ReadWriteMany only in the checkpoints component)"))
    return errors


def check_checkpoint_root(target, objs):
    """Where STAGEWISE_CHECKPOINT_ROOT is set, every coordinator and worker
    pod mounts a writable ReadWriteMany claim there (not the read-only root
    file system)."""
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    roots = [r for r in str(cms.get("stagewise-config", {}).get(
        "STAGEWISE_CHECKPOINT_ROOT", "")).split(":") if r]
    errors = []
    for r in roots:
        errors += check_checkpoint_dir(target, objs, r.rstrip("/") + "/x", None)
    return errors


# ---------------------------------------------------------------- the walkthrough

WALKTHROUGH = "From an empty cluster to a finished job"


def readme_commands(text):
    """The shell commands of deploy/README.md's walkthrough section, in
    order: [(argv, env assignments, alternatives, line)]. A comment
    `# or overlays/gpu` names an alternative to the command's last argument."""
    section = re.search(rf"^## {re.escape(WALKTHROUGH)}\n(.*?)(?=^## )", text, re.M | re.S)
    if not section:
        return []
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", section.group(1), re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            alternatives = re.findall(r"#\s*or\s+(\S+)", line)
            lx = shlex.shlex(line, posix=True, punctuation_chars=True)
            lx.whitespace_split = True
            lx.commenters = "#"
            try:
                tokens = list(lx)
            except ValueError:
                continue
            argv = []
            for tok in tokens + [";"]:
                if tok in (";", "&&", "&", "|", "||"):
                    env = {}
                    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                        k, _, v = argv.pop(0).partition("=")
                        env[k] = v
                    if argv:
                        commands.append((argv, env, alternatives, line.strip()))
                    argv = []
                else:
                    argv.append(tok)
    return commands


def option(argv, short, long):
    for i, a in enumerate(argv):
        if a == short and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(long + "="):
            return a.split("=", 1)[1]
    return None


def job_file(objs, job):
    """(file name, text) of the job file a submit Job sends, from the
    ConfigMap mounted where its `stagewise submit FILE` reads."""
    pod = job["spec"]["template"]
    c = pod["spec"]["containers"][0]
    args = c.get("args", [])
    if c.get("command") != ["stagewise"] or len(args) < 2 or args[0] != "submit":
        return None, None
    found = Checker.mount_for(c, pod, args[-1])
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    cm = found and found[0].get("configMap", {}).get("name")
    return args[-1], (cms.get(cm, {}).get(found[1]) if cm else None)


def simulate(commands, tmp, choose=None, tamper_secrets=None, tamper_objs=None):
    """Runs the walkthrough's commands against a model of the cluster: the
    objects applied so far (by kind and name) and the Secrets' data.
    make-secrets runs for real (into tmp, for ~), `kubectl apply -k` renders
    the directory, `-f` reads the file, `delete job` and `scale` change the
    model, `stagewise submit FILE` submits FILE of the repository. After each
    apply: every claim of the directory binds (check_claims), every worker pod
    has a certificate identity of its own, and each Job it applies (and each
    `stagewise submit`) can be placed (check_placement). `choose` = (line,
    alternative) takes an alternative a comment offers; tamper_* break the
    model for the self-tests. Returns (errors, what was done)."""
    errors, done = [], []
    cluster = {}  # (kind, name) -> object
    secrets = {}
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)

    def path(p):
        return os.path.join(home, p[2:]) if p.startswith("~/") else os.path.join(SRC, p)

    def objs():
        return list(cluster.values())

    for argv, env, alternatives, line in commands:
        where = f"deploy/README.md `{line}`"
        if argv[0].endswith("deploy/k8s/make-secrets") and len(argv) == 2:
            try:
                make_secrets(tmp, env, path(argv[1]))
            except subprocess.CalledProcessError as e:
                errors.append(f"{where}: make-secrets exited {e.returncode}: {e.stderr.strip()}")
                continue
            done.append(" ".join([f"{k}={v}" for k, v in env.items()] + ["make-secrets"]))
            continue
        if argv[:2] == ["stagewise", "submit"] and len(argv) >= 3:
            text = open(path(argv[-1])).read()
            errors += check_placement(where, objs(), secrets, text, argv[-1])
            done.append(f"submit {argv[-1]}")
            continue
        if argv[0] == "export":  # the CLI's files, from the secrets folder
            for a in argv[1:]:
                value = a.partition("=")[2]
                if value.startswith("~/") and not os.path.exists(path(value)):
                    errors.append(f"{where}: {value} does not exist (make-secrets makes no such file)")
            continue
        if argv[0] != "kubectl":
            continue
        verb = [a for i, a in enumerate(argv) if i > 0 and not a.startswith("-")
                and argv[i - 1] not in ("-n", "--namespace", "-f", "-k")][:2]
        if verb[:1] == ["apply"] and option(argv, "-f", "--filename"):
            f = path(option(argv, "-f", "--filename"))
            if not os.path.exists(f):
                errors.append(f"{where}: there is no {f}")
                continue
            docs = [d for d in yaml.safe_load_all(open(f)) if d]
            new = secret_data(docs)
            if tamper_secrets:
                tamper_secrets(new)
            secrets.update(new)
            for d in docs:
                cluster[(d["kind"], d["metadata"]["name"])] = d
            done.append(f"apply {len(docs)} objects")
        elif verb[:1] == ["apply"] and option(argv, "-k", "--kustomize"):
            d = option(argv, "-k", "--kustomize")
            if choose and choose[0] == line:  # `# or overlays/gpu`: the last parts of d
                alt = choose[1].strip("/").split("/")
                parts = d.rstrip("/").split("/")
                d = "/".join(parts[:len(parts) - len(alt)] + alt)
            if not d.startswith("deploy/k8s/"):
                errors.append(f"{where}: applies {d}, not a directory of deploy/k8s")
                continue
            target = os.path.relpath(os.path.join(SRC, d), K8S)
            rendered = RENDERER.render(target)
            if tamper_objs:
                tamper_objs(target, rendered)
            errors += [f"{where}: {e}" for e in check_claims(
                target, rendered, RENDERER.includes(target, CHECKPOINTS))]
            for o in rendered:
                cluster[(o["kind"], o["metadata"]["name"])] = o
            if any(o["kind"] == "StatefulSet" for o in cluster.values()):
                errors += check_identities(where, objs(), secrets)
            for o in rendered:
                if o["kind"] == "Job":
                    name, text = job_file(objs(), o)
                    if text is None:
                        errors.append(f"{where}: Job/{o['metadata']['name']} sends no job file "
                                      f"of a mounted ConfigMap")
                    else:
                        errors += check_placement(where, objs(), secrets, text, name)
            done.append(f"apply -k {target}")
        elif verb == ["delete", "job"]:
            for a in argv[argv.index("job") + 1:]:
                cluster.pop(("Job", a), None)
        elif verb[:1] == ["scale"]:
            name = [a for a in argv if a.startswith("statefulset/")]
            count = option(argv, None, "--replicas")
            if name and count and ("StatefulSet", name[0].split("/", 1)[1]) in cluster:
                cluster[("StatefulSet", name[0].split("/", 1)[1])]["spec"]["replicas"] = int(count)
                errors += check_identities(where, objs(), secrets)
    return errors, done


def check_walkthrough(tmp):
    """deploy/README.md's walkthrough, as it types it (and with each
    alternative a comment offers), places its jobs: per-pod certificate
    identities, claims a default StorageClass binds."""
    text = open(os.path.join(SRC, "deploy", "README.md")).read()
    commands = readme_commands(text)
    applied = [option(a, "-k", "--kustomize") for a, _, _, _ in commands
               if a[:2] == ["kubectl", "apply"] and option(a, "-k", "--kustomize")]
    errors = []
    for needed in ("deploy/k8s/overlays/cpu", "deploy/k8s/examples/submit"):
        if needed not in applied:
            errors.append(f"deploy/README.md: the walkthrough does not apply {needed}")
    if not any(a[0].endswith("make-secrets") for a, _, _, _ in commands):
        errors.append("deploy/README.md: the walkthrough does not run make-secrets")
    runs = [None] + [(line, alt) for _, _, alts, line in commands for alt in alts]
    for n, choose in enumerate(runs):
        found, done = simulate(commands, os.path.join(tmp, f"walkthrough-{n}"), choose)
        print(f"walkthrough{' with ' + choose[1] if choose else ''}: {'; '.join(done)}: "
              f"{len(found)} problems")
        errors += found
    return errors, commands


def walkthrough_breakages():
    """Known breakages of the walkthrough, each with what its report must say."""
    def shared_certificate(secrets):
        # One worker certificate for every pod (make-secrets before per-pod ones).
        w = secrets.get("stagewise-worker-tls", {})
        for k in list(w):
            w[k] = w.get("stagewise-worker-0" + os.path.splitext(k)[1], w[k])

    def rwx_in_base(target, objs):
        # The shared ReadWriteMany claim back in the base.
        objs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "stagewise-checkpoints"},
                     "spec": {"accessModes": ["ReadWriteMany"],
                              "resources": {"requests": {"storage": "20Gi"}}}})

    def no_workers_4(commands):
        return [c for c in commands if "WORKERS=4" not in c[3]]

    # name: (commands filter, secrets tamper, objects tamper, what the report says)
    return {"one worker certificate shared by every pod":
            (None, shared_certificate, None, "present the same certificate identity"),
            "a ReadWriteMany claim in the base":
            (None, None, rwx_in_base, "does not bind on a plain ReadWriteOnce default"),
            "the replicated example without WORKERS=4":
            (no_workers_4, None, None, "cannot be placed")}


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
    # Claims: in every target, each binds on a plain ReadWriteOnce default
    # StorageClass, but the checkpoints component's (ReadWriteMany, only in
    # the targets that include the component). A checkpoint root, where one
    # is set, is a ReadWriteMany claim mounted on every process.
    for target in TARGETS:
        objs = rendered[target]
        errors += check_claims(target, objs, RENDERER.includes(target, CHECKPOINTS))
        errors += check_checkpoint_root(target, objs)
    # The checkpointed job: in every target with the component, its
    # checkpoint.dir under --checkpoint-root, a ReadWriteMany claim mounted
    # there on every process; the overlays alone refuse it (no root).
    job = yaml.safe_load(open(os.path.join(K8S, "examples/submit/jobs/quickstart-checkpointed.yaml")))
    ckpt = job.get("checkpoint", {}).get("dir", "")
    with_component = [t for t in TARGETS if RENDERER.includes(t, CHECKPOINTS)]
    if not with_component:
        errors.append(f"no target includes {CHECKPOINTS}")
    for target in with_component:
        errors += check_checkpoint_dir(target, rendered[target], ckpt, "quickstart-checkpointed")
    for target in TARGETS:
        jobs = [o for o in rendered[target] if o["kind"] == "Job"]
        config = [o for o in rendered[target] if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "stagewise-config"]
        for j in jobs:
            name, text = job_file(rendered[target], j)
            spec = yaml.safe_load(text or "") or {}
            if config and (spec.get("checkpoint") or {}).get("dir"):
                errors += check_checkpoint_dir(target, rendered[target],
                                               spec["checkpoint"]["dir"], name)
    for target in ("overlays/cpu", "overlays/gpu"):
        objs = rendered[target]
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

    def coordinator_policy(objs):
        rule = first(objs, "NetworkPolicy", "stagewise-coordinator")["spec"]["ingress"][0]
        rule.pop("from")

    def startup(objs):
        worker_container(objs).pop("startupProbe")

    def shared_certificate(objs):
        c = worker_container(objs)
        c["args"] = [re.sub(r"\$\(POD_NAME\)", "stagewise-worker-0", a) if a.startswith("--tls-")
                     else a for a in c["args"]]

    return {"probe on another port": probe, "unknown flag": flag,
            "advertised name outside the headless Service": advertise,
            "certificate Secret not mounted": secret, "another image": image,
            "Service targetPort without a container port": service_port,
            "misspelt STAGEWISE_ variable": env, "--listen off its container port": listen,
            "NetworkPolicy without gloo's ports": network_policy,
            "coordinator's gRPC port open to every pod": coordinator_policy,
            "worker without a startupProbe": startup,
            "one certificate file for every worker pod": shared_certificate}


def check_kustomizations():
    """Today's kustomize spelling only: no deprecated commonLabels, bases,
    patchesStrategicMerge or vars in deploy/."""
    errors = []
    for root, _, files in os.walk(os.path.dirname(K8S)):
        if "kustomization.yaml" in files:
            k = yaml.safe_load(open(os.path.join(root, "kustomization.yaml")))
            for field in ("commonLabels", "bases", "patchesStrategicMerge", "vars"):
                if field in k:
                    errors.append(f"{os.path.relpath(root, SRC)}/kustomization.yaml: `{field}` is "
                                  f"deprecated (labels, resources, patches, replacements)")
    return errors


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
        errors += check_kustomizations()
        data = secret_data(secret_docs)
        for t in ("overlays/cpu", "overlays/gpu", "tests/gpu-checkpoints"):
            errors += check_identities(t, rendered[t], data)
        found, commands = check_walkthrough(tmp)
        errors += found

        caught = 0
        before = set(Checker(rendered["overlays/cpu"], helpinfo, image, secrets).check())
        for what, breakage in breakages().items():
            objs = copy.deepcopy(rendered["overlays/cpu"])
            breakage(objs)
            found = [e for e in Checker(objs, helpinfo, image, secrets).check() if e not in before]
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
        for n, (what, (keep, secrets_tamper, objs_tamper, says)) in enumerate(
                walkthrough_breakages().items()):
            found, _ = simulate(keep(commands) if keep else commands,
                                os.path.join(tmp, f"walkthrough-breakage-{n}"), None,
                                secrets_tamper, objs_tamper)
            found = [e for e in found if says in e]
            if found:
                caught += 1
                print(f"breakage '{what}' is caught: {found[0]}")
            else:
                errors.append(f"self-test: the breakage '{what}' went unnoticed "
                              f"(no report saying '{says}')")
        total = (len(breakages()) + len(monitoring_checks.breakages())
                 + len(walkthrough_breakages()))
        print(f"{caught} of {total} breakages caught")

    for e in errors:
        print("FAIL:", e)
    if errors:
        sys.exit(1)
    print("ok: every overlay renders, validates and matches the binaries; the walkthrough's "
          "jobs can be placed")


if __name__ == "__main__":
    main()
