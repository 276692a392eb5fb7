#!/usr/bin/env python3
"""ctest -L deploy: a real Prometheus scrapes a real `stagewise local` run.

Starts `stagewise local` with a long 2-stage job, points a Prometheus server
on loopback (Debian's `prometheus`) at the coordinator's and the workers'
/metrics with the rules of deploy/prometheus/rules and the scrape job of
deploy/prometheus/prometheus.yml (its honor_labels and metric_relabel_configs
as written; static targets with the labels Kubernetes discovery would add:
namespace, pod, app_kubernetes_io_component), and checks, while the job
trains:
  - `promtool check metrics` is clean on every /metrics endpoint;
  - the job id stagewise exposes as `job` arrives as `job_id`, Prometheus'
    `job` is the scrape job, no series keeps exported_job, and the
    coordinator-wide series (no job id) arrive without job_id;
  - every recording rule produces series for the job (and its stages);
  - StagewiseCoordinatorDown's expression is empty while the coordinator is
    up (and not for a component that has no target);
  - every dashboard variable (label_values) offers the namespace, the job and
    its stages, and every panel's query, with $datasource, $namespace, $job
    and $stage substituted, returns data.
Then stops the job (SIGINT, as Ctrl-C) and cleans up.
Usage: prometheus_scrape_test.py SOURCE_DIR BINARY_DIR. Exit 77: no prometheus.
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

SOURCE, BINARY = sys.argv[1], sys.argv[2]
RULES = os.path.join(SOURCE, "deploy", "prometheus", "rules", "stagewise.rules.yml")
PROMETHEUS_YML = os.path.join(SOURCE, "deploy", "prometheus", "prometheus.yml")
NAMESPACE = "stagewise-scrape-test"
DASHBOARDS = os.path.join(SOURCE, "deploy", "grafana", "dashboards")
JOB = """name: scrape-test
model: {name: mlp, hidden: [64, 32]}
data: {dataset: synthetic, train_size: 4096, test_size: 256, shape: [1, 16, 16], classes: 4}
batch_size: 32
stages: 2
steps: 100000000
eval: {every_steps: 50}
"""


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def check_dashboard(path, d):
    """The parts of Grafana's dashboard model (schemaVersion 36) we rely on."""
    name = os.path.basename(path)
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict)):
        if not isinstance(d.get(key), kind):
            fail("%s: '%s' must be a %s" % (name, key, kind.__name__))
    variables = {v["name"] for v in d["templating"].get("list", [])}
    ids = set()
    for panel in d["panels"]:
        for key in ("id", "type", "title", "gridPos", "targets"):
            if key not in panel:
                fail("%s: a panel without '%s'" % (name, key))
        if panel["id"] in ids:
            fail("%s: panel id %s twice" % (name, panel["id"]))
        ids.add(panel["id"])
        g = panel["gridPos"]
        if g["x"] < 0 or g["w"] <= 0 or g["x"] + g["w"] > 24 or g["h"] <= 0:
            fail("%s: panel '%s' is outside the 24-column grid" % (name, panel["title"]))
        refs = [t["refId"] for t in panel["targets"]]
        if not refs or len(set(refs)) != len(refs):
            fail("%s: panel '%s' needs targets with distinct refIds" % (name, panel["title"]))
        for t in panel["targets"]:
            for used in re.findall(r"\$\{?(\w+)", t["expr"] + json.dumps(t.get("datasource", ""))):
                if used not in variables:
                    fail("%s: panel '%s' uses an undefined variable $%s" % (name, panel["title"], used))


def substitute(text, values):
    """Grafana's variable syntax: $name and ${name}."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)\b",
                  lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def scrape_job():
    """The stagewise scrape job of prometheus.yml, without its Kubernetes
    discovery (targets and their labels come from this test)."""
    conf = yaml.safe_load(open(PROMETHEUS_YML))
    jobs = [s for s in conf["scrape_configs"] if s["job_name"] == "stagewise"]
    if len(jobs) != 1:
        fail("prometheus.yml: expected one scrape job named stagewise")
    job = jobs[0]
    if job.get("honor_labels") is True:
        fail("prometheus.yml: honor_labels is true (the job id belongs in job_id)")
    return {k: v for k, v in job.items() if k in ("job_name", "honor_labels", "metric_relabel_configs")}


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    fail("timed out waiting for " + what)


def main():
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        print("prometheus not found (apt-get install prometheus): skipped")
        return 77
    work = tempfile.mkdtemp(prefix="stagewise_prometheus_")
    local = prom = None
    local_dir = None
    try:
        job_path = os.path.join(work, "job.yaml")
        with open(job_path, "w") as f:
            f.write(JOB)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        local = subprocess.Popen(
            [os.path.join(BINARY, "bin", "stagewise"), "local", "--keep-logs", "--threads", "1", job_path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
        # "local: starting ...; logs in DIR"
        line = local.stderr.readline()
        m = re.search(r"logs in (\S+)", line)
        if not m:
            fail("no log directory in: " + line)
        local_dir = m.group(1)

        def ports(name):
            path = os.path.join(local_dir, name + ".port")
            try:
                grpc_port, metrics_port = open(path).read().split()
                return int(metrics_port)
            except (OSError, ValueError):
                return None

        targets = {"coordinator": wait_for("the coordinator", lambda: ports("coordinator"), 60)}
        for n in range(2):
            targets["worker-%d" % n] = wait_for("worker %d" % n, lambda n=n: ports("worker-%d" % n), 60)

        port = free_port()
        config = os.path.join(work, "prometheus.yml")
        static = []
        for name, p in targets.items():
            component = "coordinator" if name == "coordinator" else "worker"
            static.append({"targets": ["127.0.0.1:%d" % p],
                           "labels": {"app_kubernetes_io_component": component, "pod": name,
                                      "namespace": NAMESPACE}})
        job_config = dict(scrape_job(), static_configs=static)
        with open(config, "w") as f:
            json.dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                       "rule_files": [RULES],
                       "scrape_configs": [job_config]}, f)
        prom = subprocess.Popen(
            ["prometheus", "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(work, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"))
        api = "http://127.0.0.1:%d/api/v1/" % port

        def query(expr):
            try:
                body = json.loads(get(api + "query?" + urllib.parse.urlencode({"query": expr})))
            except OSError:
                return []
            return body["data"]["result"] if body.get("status") == "success" else []

        # The job trains: its stages export their series.
        step = wait_for("the job's step metric", lambda: query("stagewise_job_step > 5"), 120)[0]
        job_id = step["metric"].get("job_id")
        print("job", job_id, "is training; Prometheus on port", port, flush=True)

        # The labels: job_id is the job id, job the scrape job.
        scrape_name = job_config["job_name"]
        if not job_id or step["metric"].get("job") != scrape_name:
            fail("stagewise_job_step arrives as %s: expected job_id=<the job id> and job=%s"
                 % (step["metric"], scrape_name))
        stage_series = wait_for("the stages' series", lambda: query(
            'stagewise_stage_steps_total{job_id="%s"}' % job_id), 60)
        for r in stage_series:
            if r["metric"].get("job") != scrape_name or r["metric"].get("namespace") != NAMESPACE:
                fail("a stage series arrives as %s" % r["metric"])
        if query('{exported_job=~".+"}'):
            fail("series keep exported_job: %s" % query('{exported_job=~".+"}')[0]["metric"])
        wide = wait_for("the coordinator-wide series", lambda: query("stagewise_coordinator_workers"), 60)
        if any("job_id" in r["metric"] or r["metric"].get("job") != scrape_name for r in wide):
            fail("coordinator-wide series arrive as %s" % [r["metric"] for r in wide])
        print("labels: job_id=%s, job=%s, no exported_job; %d coordinator-wide series without job_id"
              % (job_id, scrape_name, len(wide)), flush=True)

        for name, p in targets.items():
            text = get("http://127.0.0.1:%d/metrics" % p)
            check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                                   capture_output=True)
            if check.returncode != 0:
                fail("promtool check metrics on %s:\n%s%s" % (name, check.stdout, check.stderr))
            print("promtool check metrics:", name, "clean", flush=True)

        rules = re.findall(r"record: (\S+)", open(RULES).read())
        if len(rules) < 5:
            fail("expected the recording rules in " + RULES)
        for rule in rules:
            result = wait_for("recording rule " + rule,
                              lambda rule=rule: query('%s{job_id="%s"}' % (rule, job_id)), 60)
            print("rule", rule, "->", len(result), "series", flush=True)
        per_stage = query('stagewise:stage_compute_utilisation:rate1m{job_id="%s"}' % job_id)
        stages = sorted(r["metric"].get("stage") for r in per_stage)
        if stages != ["0", "1"]:
            fail("compute utilisation per stage: got stages %s" % stages)
        if not query('up{app_kubernetes_io_component="worker"} == 1'):
            fail("no worker target is up")
        alerts = {r["alert"]: r for g in yaml.safe_load(open(RULES))["groups"]
                  for r in g["rules"] if "alert" in r}
        down = alerts["StagewiseCoordinatorDown"]["expr"]
        if not query('up{app_kubernetes_io_component="coordinator"} == 1') or query(down):
            fail("the coordinator is up, yet StagewiseCoordinatorDown's expression is %s" % query(down))
        if not query(down.replace('"coordinator"', '"nothing-scraped"')):
            fail("StagewiseCoordinatorDown's expression stays empty for a component without targets")
        print("StagewiseCoordinatorDown: quiet while the coordinator is up", flush=True)

        # Every variable of every dashboard offers this job, and every panel
        # returns data for it.
        values = {"datasource": "prometheus", "namespace": NAMESPACE, "job": job_id, "stage": "0|1"}
        offered = {"namespace": [NAMESPACE], "job": [job_id], "stage": ["0", "1"]}
        for path in sorted(glob.glob(os.path.join(DASHBOARDS, "*.json"))):
            dashboard = json.load(open(path))
            check_dashboard(path, dashboard)
            for var in dashboard["templating"]["list"]:
                if var["type"] != "query":
                    continue
                q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                m = re.match(r"^label_values\((.*),\s*(\w+)\)$", substitute(q, values))
                if not m or var["name"] not in offered:
                    fail("%s: variable %s: expected label_values(QUERY, LABEL) of namespace, job or "
                         "stage, got %s" % (os.path.basename(path), var["name"], q))
                want = offered[var["name"]]
                got = wait_for("%s variable %s: %s" % (os.path.basename(path), var["name"], q),
                               lambda m=m, want=want: (lambda vs: vs if set(want) <= vs else None)(
                                   {r["metric"].get(m.group(2)) for r in query(m.group(1))}), 90)
                print("variable %s / %s offers %s" % (dashboard["title"], var["name"], sorted(got)),
                      flush=True)
            for panel in dashboard["panels"]:
                for target in panel["targets"]:
                    expr = substitute(target["expr"], values)
                    if "$" in expr:
                        fail("%s: a variable left in %s" % (os.path.basename(path), expr))
                    result = wait_for("%s panel '%s': %s" % (os.path.basename(path), panel["title"], expr),
                                      lambda expr=expr: query(expr), 90)
                    print("panel %s / %s -> %d series" % (dashboard["title"], panel["title"], len(result)),
                          flush=True)
        print("PASS", flush=True)
        return 0
    finally:
        if local and local.poll() is None:
            local.send_signal(signal.SIGINT)
            try:
                local.wait(timeout=60)
            except subprocess.TimeoutExpired:
                local.kill()
        if prom:
            prom.terminate()
            try:
                prom.wait(timeout=30)
            except subprocess.TimeoutExpired:
                prom.kill()
        if local_dir:
            shutil.rmtree(local_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
