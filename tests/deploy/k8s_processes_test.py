#!/usr/bin/env python3
"""ctest -L deploy: the cpu overlay's pods, run as plain processes.

  k8s_processes_test.py SOURCE_DIR BINARY_DIR

Renders deploy/k8s/overlays/cpu with the submit example (the walkthrough of
deploy/README.md), and examples/checkpointed (the cpu overlay with the
checkpoints component and its own submit Job), makes the Secrets with
deploy/k8s/make-secrets (one certificate per worker pod), and runs each
container as Kubernetes would (its command, its args with $(VAR) expanded,
the ConfigMap's environment, the downward API's pod name and limits, every
Secret written where the pod mounts it) on this machine: the coordinator,
stagewise-worker-0 and -1, then the submit Job's `stagewise submit`. What
this machine has no stand-in for is rewritten, and only that: paths under a
volume's mountPath go to a folder of the test, listen addresses
0.0.0.0:PORT become 127.0.0.1:0 (the three pods would share ports here), the
coordinator's Service name becomes its address, and a worker's advertised
host (its name in the headless Service, which needs cluster DNS) becomes
127.0.0.1.

So the manifests' own flags, settings, certificates (verified for
STAGEWISE_TLS_SERVER_NAME on every channel, worker to worker included) and
tokens must make a cluster that trains a 2-stage job to SUCCEEDED, with
placement.distinct_identities at its default (each worker pod presents its
own certificate, picked by its pod name); with the component, checkpoints
are committed on the shared claim; a client without the token is refused;
each process ends cleanly on SIGTERM.
Exit 77 (skipped) without kubectl.
"""
import base64
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_k8s as k8s  # noqa: E402  (rendering and make-secrets)

TINY_JOB = """# the submit example's job file, made tiny for the test
name: k8s-processes
model: {name: mlp, hidden: [32]}
data: {dataset: synthetic, train_size: 512, test_size: 64, shape: [1, 8, 8], classes: 4}
algorithm: backprop
stages: 2
batch_size: 32
steps: 8
"""  # placement.distinct_identities: the default (true), as in the examples


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def quantity(q):
    """A Kubernetes quantity as a number (4Gi, 512Mi, 2, 250m)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?", str(q))
    if not m:
        fail(f"cannot read quantity {q}")
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6,
             "G": 1e9, "T": 1e12, "m": 1e-3}[m.group(2)]
    return float(m.group(1)) * scale


class Pod:
    """One container of a rendered pod template, as a process here."""

    def __init__(self, root, name, template, objs, secrets, coordinator=None):
        # Claims not made by a volumeClaimTemplate are shared by every pod
        # (ReadWriteMany): one folder per claim under root/claims.
        self.name = name
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        spec = template["spec"]
        self.c = spec["containers"][0]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objs
                      if o["kind"] == "ConfigMap"}
        # Volumes: Secrets and ConfigMaps written out, the rest empty folders.
        self.mounts = {}
        for m in self.c.get("volumeMounts", []):
            local = os.path.join(self.dir, "volumes", m["name"])
            os.makedirs(local, exist_ok=True)
            v = volumes.get(m["name"], {})
            if "persistentVolumeClaim" in v:
                local = os.path.join(root, "claims", v["persistentVolumeClaim"]["claimName"])
                os.makedirs(local, exist_ok=True)
            files = {}
            if "secret" in v:
                data = secrets.get(v["secret"]["secretName"])
                if data is None:
                    fail(f"{name}: Secret {v['secret']['secretName']} is not made by make-secrets")
                files = data
            elif "configMap" in v:
                files = {k: t.encode() for k, t in configmaps[v["configMap"]["name"]].items()}
            for key, content in files.items():
                with open(os.path.join(local, key), "wb") as f:
                    f.write(content)
                os.chmod(os.path.join(local, key), v.get("secret", {}).get("defaultMode", 0o644) & 0o777)
            self.mounts[m["mountPath"].rstrip("/")] = local
        # Environment: ConfigMaps, then env (downward API included).
        env = {}
        for ef in self.c.get("envFrom", []):
            env.update(configmaps[ef["configMapRef"]["name"]])
        limits = self.c.get("resources", {}).get("limits", {})
        for e in self.c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            src = e["valueFrom"]
            if "fieldRef" in src:
                assert src["fieldRef"]["fieldPath"] == "metadata.name"
                env[e["name"]] = name
            elif "resourceFieldRef" in src:
                r = src["resourceFieldRef"]["resource"]
                value = quantity(limits[r.split(".", 1)[1]])
                env[e["name"]] = str(math.ceil(value))  # divisor 1: whole cores, bytes
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                env[e["name"]] = secrets[ref["name"]][ref["key"]].decode()
        if coordinator is not None and "STAGEWISE_COORDINATOR" in env:
            env["STAGEWISE_COORDINATOR"] = coordinator
        self.env = {k: self.local(v) for k, v in env.items()}
        # Arguments: $(VAR), then what this machine has no stand-in for.
        args = []
        for a in self.c.get("args", []):
            a = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a)
            a = re.sub(r"^(--[\w-]*listen)=0\.0\.0\.0:\d+$", r"\1=127.0.0.1:0", a)
            a = re.sub(r"^--advertise=.*$", "--advertise=127.0.0.1", a)
            args.append(self.local(a))
        self.argv = [os.path.join(k8s.BIN, self.c["command"][0])] + args
        self.proc = None

    def local(self, text):
        """A path (or --flag=path) under a mountPath, moved to its folder here."""
        if not self.mounts:
            return text
        # One pass, longest mountPath first: a replaced path is not looked at again.
        alternatives = "|".join(re.escape(m) for m in sorted(self.mounts, key=len, reverse=True))
        return re.sub(rf"(^|=)({alternatives})(?=/|$)",
                      lambda m: m.group(1) + self.mounts[m.group(2)], text)

    def environ(self):
        e = {k: v for k, v in os.environ.items() if not k.startswith("STAGEWISE_")}
        e.update(self.env)
        e["OMP_NUM_THREADS"] = "1"
        return e

    def start(self):
        self.port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(self.argv + [f"--port-file={self.port_file}"],
                                     env=self.environ(), stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=self.dir)

    def port(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            if os.path.exists(self.port_file) and open(self.port_file).read().strip():
                return int(open(self.port_file).read().split()[0])
            time.sleep(0.1)
        fail(f"{self.name} did not start:\n{self.tail()}")

    def tail(self):
        return "".join(open(os.path.join(self.dir, "log")).readlines()[-30:])

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return None
        start = time.time()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            fail(f"{self.name} did not stop within 60 s of SIGTERM:\n{self.tail()}")
        return rc, time.time() - start


def submit(client, timeout=120):
    """Runs the submit Job's `stagewise submit`; fails at once when the
    coordinator says the job waits for workers it cannot have (a shared
    certificate identity), or after `timeout` seconds."""
    proc = subprocess.Popen(client.argv, env=client.environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=client.dir)
    deadline = time.time() + timeout
    while proc.poll() is None:
        r = subprocess.run([client.argv[0], "list", "-o", "json"], env=client.environ(),
                           capture_output=True, text=True, timeout=30)
        waiting = [j for j in (json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip()
                               else []) if "waiting for" in (j.get("reason") or "")]
        if any("identit" in j["reason"] for j in waiting) or time.time() > deadline:
            proc.kill()
            proc.communicate()
            fail(f"the job was not placed: {r.stdout.strip()}")
        time.sleep(0.5)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def main():
    if shutil.which("kubectl") is None:
        k8s.skip("kubectl not found (scripts/setup installs it)")
    with tempfile.TemporaryDirectory(prefix="stagewise_k8s_processes_") as tmp:
        rendered = k8s.render_all(tmp)
        for target in ("overlays/cpu", "examples/checkpointed"):
            print(f"=== {target}")
            run_target(rendered, target, os.path.join(tmp, target.replace("/", "_")))


def run_target(rendered, target, tmp):
    pods = []
    os.makedirs(tmp)
    try:
        objs = rendered[target]
        sets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StatefulSet"}
        workers = sets["stagewise-worker"]
        # One certificate per worker pod, as deploy/README.md makes them.
        _, docs = k8s.make_secrets(tmp, {"WORKERS": str(workers["spec"]["replicas"])})
        secrets = {d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()}
                   for d in docs}
        coord = Pod(tmp, "stagewise-coordinator-0", sets["stagewise-coordinator"]["spec"]["template"],
                    objs, secrets)
        pods.append(coord)
        coord.start()
        address = f"127.0.0.1:{coord.port()}"
        print(f"coordinator: {' '.join(coord.argv[1:])}\n  serving on {address}")
        for i in range(workers["spec"]["replicas"]):
            w = Pod(tmp, f"stagewise-worker-{i}", workers["spec"]["template"], objs, secrets,
                    coordinator=address)
            pods.append(w)
            w.start()
            print(f"{w.name}: port {w.port()}")
        print(f"workers: {' '.join(pods[1].argv[1:])}")

        # The target's own submit Job (examples/checkpointed), else the
        # submit example's (deploy/README.md applies it after the overlay).
        submit_objs = objs if any(o["kind"] == "Job" for o in objs) else \
            rendered["examples/submit"] + objs
        job = [o for o in submit_objs if o["kind"] == "Job"][0]
        _, sent = k8s.job_file(submit_objs, job)
        job_text = TINY_JOB
        ckpt_root = coord.env.get("STAGEWISE_CHECKPOINT_ROOT")
        ckpt = (yaml.safe_load(sent).get("checkpoint") or {}).get("dir")
        if ckpt_root:
            # The checkpointed job file's checkpoint.dir, on the shared claim.
            if not ckpt:
                fail(f"{target} sets a checkpoint root, but its Job sends a job without checkpoints")
            job_text += f"checkpoint: {{dir: {coord.local(ckpt)}, every_steps: 4, keep: 2}}\n"
        elif ckpt:
            fail(f"{target}'s Job sends a job with checkpoint.dir {ckpt}, but no process has a "
                 f"checkpoint root")
        for o in submit_objs:  # the job file, made tiny
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("stagewise-jobs"):
                for key in o["data"]:
                    o["data"][key] = job_text
        client = Pod(tmp, "stagewise-submit", job["spec"]["template"], submit_objs, secrets,
                     coordinator=address)
        # Both workers registered (as the pod names), as the client sees it.
        deadline = time.time() + 60
        while True:
            r = subprocess.run([client.argv[0], "workers"], env=client.environ(),
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and all(f"stagewise-worker-{i}" in r.stdout
                                         for i in range(len(pods) - 1)):
                break
            if time.time() > deadline:
                fail(f"workers did not register: {r.stdout}{r.stderr}\n{pods[1].tail()}")
            time.sleep(0.5)
        print(r.stdout.strip())
        print(f"submit: {' '.join(client.argv[1:])}")
        result = submit(client)
        print(result.stdout[-1500:])
        if result.returncode != 0:
            fail(f"stagewise submit exited {result.returncode}: {result.stderr[-2000:]}\n"
                 f"{pods[1].tail()}\n{pods[2].tail()}")
        if not re.search(r"^state +SUCCEEDED", result.stdout, re.M):
            fail("the job did not end SUCCEEDED")
        if ckpt_root:
            manifests = [os.path.join(d, "MANIFEST") for d, _, f in os.walk(ckpt_root)
                         if "MANIFEST" in f]
            if not manifests:
                fail(f"no committed checkpoint under {ckpt_root} (the shared claim)")
            print(f"ok: {len(manifests)} committed checkpoints on the shared claim, e.g. "
                  f"{os.path.relpath(manifests[0], tmp)}")
        # Without the token the coordinator refuses the same client.
        env = client.environ()
        env.pop("STAGEWISE_TOKEN")
        r = subprocess.run([client.argv[0], "list"], env=env, capture_output=True, text=True,
                           timeout=30)
        if r.returncode == 0 or "bearer token" not in r.stderr:
            fail(f"a client without a token was not refused: {r.returncode} {r.stderr}")
        print(f"ok: a client without the token is refused: {r.stderr.strip()}")
    finally:
        stops = []
        for p in reversed(pods):
            stopped = p.stop()
            if stopped is not None:
                stops.append((p, *stopped))
    for p, rc, seconds in stops:
        print(f"{p.name}: exit {rc} {seconds:.1f} s after SIGTERM")
        if rc != 0:
            fail(f"{p.name} exited {rc} on SIGTERM:\n{p.tail()}")
    print(f"ok: {target}: the pods train a job with their own flags, Secrets and tokens")


if __name__ == "__main__":
    main()
