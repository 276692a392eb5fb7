"""Checks of the monitoring objects (deploy/k8s/overlays/monitoring,
deploy/prometheus, deploy/grafana), used by check_k8s.py.

check(objs) takes the rendered monitoring overlay and returns a list of
problems:
  - the ServiceMonitor carries the `release` label kube-prometheus-stack
    selects on (and the PrometheusRule the same one), does not honour labels,
    and its metricRelabelings turn exported_job into job_id (simulated on a
    stage series and on a coordinator-wide series without a job id); the
    same for prometheus.yml's metric_relabel_configs;
  - the PrometheusRule's groups are those of
    deploy/prometheus/rules/stagewise.rules.yml (with the overlay's
    runbook_base in front of each runbook_url); StagewiseCoordinatorDown is
    one of them; every alert has a runbook_url that is a URL, the overlay's
    parameter runbook_base followed by deploy/README.md#<a heading of
    deploy/README.md>;
  - every dashboard of deploy/grafana/dashboards is a ConfigMap labelled
    grafana_dashboard: "1" whose JSON equals the file; each has a datasource
    variable (type datasource, prometheus) used by every panel, a namespace
    variable, and every selector of a stagewise series (or up) filters on
    namespace=~"$namespace";
  - nothing (rules, alerts, dashboards) uses `job` as the job id any more.
breakages() lists known breakages of the rendered overlay, each with what
check() must then report.
"""
import json
import os
import re

import yaml

SRC = None  # set by init()
RULE_PATTERN_JOB = re.compile(r'\bjob\s*(=~|!=|=)\s*"\$job"|\bby\s*\([^)]*\bjob\b[^)]*\)'
                              r'|\$labels\.job\b')
SELECTOR = re.compile(r'\b((?:stagewise[:_][A-Za-z0-9_:]+)|up)\b(\{[^}]*\})?')
NAMESPACE_FILTER = 'namespace=~"$namespace"'


def init(src):
    global SRC
    SRC = src


def path(*parts):
    return os.path.join(SRC, *parts)


# ---------------------------------------------------------------- relabelling

def relabel(labels, configs):
    """Applies Prometheus relabel configs (snake_case or the Operator's
    camelCase) to a label set; None when the series is dropped."""
    labels = dict(labels)
    for c in configs:
        c = {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): v for k, v in c.items()}
        action = c.get("action", "replace").lower()
        regex = re.compile("^(?:%s)$" % c.get("regex", "(.*)"))
        value = c.get("separator", ";").join(labels.get(s, "") for s in c.get("source_labels", []))
        if action == "replace":
            m = regex.match(value)
            if m:
                target = c.get("target_label")
                rep = re.sub(r"\$\{?(\w+)\}?", lambda g: m.expand("\\g<%s>" % g.group(1)) or "",
                             c.get("replacement", "$1"))
                if rep:
                    labels[target] = rep
                else:
                    labels.pop(target, None)
        elif action == "keep":
            if not regex.match(value):
                return None
        elif action == "drop":
            if regex.match(value):
                return None
        elif action == "labeldrop":
            labels = {k: v for k, v in labels.items() if not regex.match(k)}
        elif action == "labelkeep":
            labels = {k: v for k, v in labels.items() if regex.match(k)}
        elif action == "labelmap":
            for k, v in list(labels.items()):
                m = regex.match(k)
                if m:
                    labels[m.expand(c.get("replacement", "\\1").replace("$", "\\"))] = v
        else:
            raise ValueError("relabel action %s is not simulated here" % action)
    return labels


def check_relabelling(where, honor, configs, scrape_job):
    """stagewise exposes job="<job id>"; without honour, Prometheus renames it
    to exported_job. The configs must leave job_id=<job id>, no exported_job,
    and the scrape job in `job`; a series without a job id keeps no job_id."""
    errors = []
    if honor:
        errors.append(f"{where}: honours labels, so stagewise's job id takes Prometheus' `job`")
    stage = relabel({"__name__": "stagewise_stage_steps_total", "job": scrape_job,
                     "exported_job": "job-7", "stage": "0"}, configs)
    if stage is None or stage.get("job_id") != "job-7" or "exported_job" in stage \
            or stage.get("job") != scrape_job:
        errors.append(f"{where}: a stage series exposed with job=\"job-7\" becomes {stage}, "
                      f"expected job_id=job-7, job={scrape_job} and no exported_job")
    wide = relabel({"__name__": "stagewise_coordinator_workers", "job": scrape_job,
                    "state": "idle"}, configs)
    if wide is None or wide.get("job_id") or wide.get("job") != scrape_job:
        errors.append(f"{where}: the coordinator-wide series stagewise_coordinator_workers "
                      f"(no job id) becomes {wide}")
    return errors


# ---------------------------------------------------------------- README anchors

def readme_anchors():
    """GitHub's heading anchors of deploy/README.md, and explicit id= ones."""
    anchors, seen = set(), {}
    in_code = False
    for line in open(path("deploy", "README.md")):
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(a, 0)
            seen[a] = n + 1
            anchors.add(a if n == 0 else f"{a}-{n}")
        anchors.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return anchors


# ---------------------------------------------------------------- the pieces

def check_servicemonitor(objs):
    errors = []
    sms = [o for o in objs if o["kind"] == "ServiceMonitor"]
    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    if len(sms) != 1 or len(rules) != 1:
        return [f"monitoring: expected one ServiceMonitor and one PrometheusRule, found "
                f"{len(sms)} and {len(rules)}"]
    sm, pr = sms[0], rules[0]
    release = sm["metadata"].get("labels", {}).get("release")
    if not release:
        errors.append("ServiceMonitor/stagewise: no `release` label (kube-prometheus-stack "
                      "selects ServiceMonitors by release=<its Helm release>)")
    if pr["metadata"].get("labels", {}).get("release") != release:
        errors.append(f"PrometheusRule/{pr['metadata']['name']}: release label "
                      f"{pr['metadata'].get('labels', {}).get('release')} is not the "
                      f"ServiceMonitor's {release}")
    eps = sm["spec"].get("endpoints", [])
    if not eps or any(e.get("port") != "metrics" for e in eps):
        errors.append("ServiceMonitor/stagewise: every endpoint must scrape the port named metrics")
    for i, e in enumerate(eps):
        errors += check_relabelling(f"ServiceMonitor/stagewise endpoint {i}",
                                    e.get("honorLabels") is True,
                                    e.get("metricRelabelings", []), "stagewise-worker")
    return errors


def check_prometheus_yml():
    conf = yaml.safe_load(open(path("deploy", "prometheus", "prometheus.yml")))
    errors = []
    for sc in conf.get("scrape_configs", []):
        errors += check_relabelling(f"prometheus.yml scrape job {sc['job_name']}",
                                    sc.get("honor_labels") is True,
                                    sc.get("metric_relabel_configs", []), sc["job_name"])
    return errors


def check_rules(objs):
    errors = []
    rules_file = path("deploy", "prometheus", "rules", "stagewise.rules.yml")
    want = yaml.safe_load(open(rules_file))["groups"]
    for pr in (o for o in objs if o["kind"] == "PrometheusRule"):
        where = f"PrometheusRule/{pr['metadata']['name']}"
        groups = pr.get("spec", {}).get("groups")
        if without_runbook_base(groups) != want:
            errors.append(f"{where}: its groups are not those of deploy/prometheus/rules/"
                          f"stagewise.rules.yml (run deploy/prometheus/make-prometheusrule)")
        anchors = readme_anchors()
        alerts = {}
        for g in groups or []:
            for r in g.get("rules", []):
                text = r.get("expr", "") + json.dumps(r.get("annotations", {}))
                if RULE_PATTERN_JOB.search(text):
                    errors.append(f"{where}: {r.get('alert') or r.get('record')} uses `job` as "
                                  f"the job id (it is job_id)")
                if "alert" in r:
                    alerts[r["alert"]] = r
        base = runbook_base()
        for name, r in alerts.items():
            url = r.get("annotations", {}).get("runbook_url", "")
            m = re.match(r"^(\S*?)deploy/README\.md#([\w-]+)$", url)
            if not m:
                errors.append(f"{where}: alert {name} has no runbook_url into deploy/README.md "
                              f"(got {url!r})")
                continue
            if m.group(2) not in anchors:
                errors.append(f"{where}: alert {name}: runbook anchor #{m.group(2)} is no "
                              f"section of deploy/README.md")
            if not re.match(r"^https?://[^/\s]+/(\S*/)?$", m.group(1)) or m.group(1) != base:
                errors.append(f"{where}: alert {name}: runbook_url {url!r} is not a URL with the "
                              f"overlay's runbook_base {base!r} in front of deploy/README.md")
        down = alerts.get("StagewiseCoordinatorDown")
        if down is None:
            errors.append(f"{where}: no StagewiseCoordinatorDown alert")
        elif 'app_kubernetes_io_component="coordinator"' not in down["expr"] \
                or "absent(" not in down["expr"]:
            errors.append(f"{where}: StagewiseCoordinatorDown must watch the coordinator's up "
                          f"series, and fire when it is absent")
    return errors


def runbook_base():
    """The monitoring overlay's parameter runbook_base: a literal of its
    local-config ConfigMap stagewise-monitoring-parameters."""
    k = yaml.safe_load(open(path("deploy", "k8s", "overlays", "monitoring", "kustomization.yaml")))
    for g in k.get("configMapGenerator", []):
        if g.get("name") == "stagewise-monitoring-parameters":
            for kv in g.get("literals", []):
                key, _, value = kv.partition("=")
                if key == "runbook_base":
                    return value
    return None


def without_runbook_base(groups):
    """The rule groups with each runbook_url back to its repository path
    (what rules/stagewise.rules.yml says)."""
    groups = json.loads(json.dumps(groups))
    for g in groups or []:
        for r in g.get("rules", []):
            a = r.get("annotations", {})
            if "runbook_url" in a:
                a["runbook_url"] = re.sub(r"^\S*?(deploy/README\.md#)", r"\1", a["runbook_url"])
    return groups


def check_dashboard_model(name, d):
    errors = []
    variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append(f"{name}: needs a variable `datasource` of type datasource (prometheus)")
    ns = variables.get("namespace")
    if not ns or ns.get("type") != "query":
        errors.append(f"{name}: needs a query variable `namespace`")
    exprs = []
    for v in variables.values():
        if v.get("type") == "query":
            if v.get("datasource", {}).get("uid") != "${datasource}":
                errors.append(f"{name}: variable {v['name']} does not use ${{datasource}}")
            if v["name"] != "namespace":
                q = v.get("query")
                exprs.append((f"variable {v['name']}", q.get("query") if isinstance(q, dict) else q))
    for panel in d.get("panels", []):
        sources = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
        if any((s or {}).get("uid") != "${datasource}" for s in sources):
            errors.append(f"{name}: panel '{panel.get('title')}' does not use ${{datasource}}")
        exprs += [(f"panel '{panel.get('title')}'", t.get("expr", "")) for t in panel.get("targets", [])]
    for where, e in exprs:
        if RULE_PATTERN_JOB.search(e):
            errors.append(f"{name}: {where} uses `job` as the job id (it is job_id): {e}")
        for m in SELECTOR.finditer(e):
            if NAMESPACE_FILTER not in (m.group(2) or ""):
                errors.append(f"{name}: {where}: {m.group(1)} is not filtered on "
                              f"{NAMESPACE_FILTER}: {e}")
    return errors


def check_dashboards(objs):
    errors = []
    folder = path("deploy", "grafana", "dashboards")
    canonical = {f: json.load(open(os.path.join(folder, f)))
                 for f in sorted(os.listdir(folder)) if f.endswith(".json")}
    if not canonical:
        return [f"no dashboards in {folder}"]
    found = {}
    for cm in (o for o in objs if o["kind"] == "ConfigMap"):
        where = f"ConfigMap/{cm['metadata']['name']}"
        keys = [k for k in cm.get("data", {}) if k.endswith(".json")]
        if keys and cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
            errors.append(f"{where}: a dashboard without the label grafana_dashboard: \"1\" "
                          f"(Grafana's sidecar loads only those)")
        for k in keys:
            if k not in canonical:
                errors.append(f"{where}: {k} is not a dashboard of deploy/grafana/dashboards")
            elif json.loads(cm["data"][k]) != canonical[k]:
                errors.append(f"{where}: {k} differs from deploy/grafana/dashboards/{k}")
            found.setdefault(k, []).append(where)
    for k, d in canonical.items():
        if len(found.get(k, [])) != 1:
            errors.append(f"dashboard {k}: in {len(found.get(k, []))} ConfigMaps, expected one")
        errors += check_dashboard_model(k, d)
    return errors


def check(objs):
    return (check_servicemonitor(objs) + check_prometheus_yml() + check_rules(objs)
            + check_dashboards(objs))


# ---------------------------------------------------------------- breakages

def breakages():
    def one(objs, kind):
        return [o for o in objs if o["kind"] == kind][0]

    def first_alert(objs):
        return [r for g in one(objs, "PrometheusRule")["spec"]["groups"]
                for r in g["rules"] if "alert" in r][0]

    def no_release(objs):
        del one(objs, "ServiceMonitor")["metadata"]["labels"]["release"]

    def honor(objs):
        one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] = True

    def no_relabel(objs):
        one(objs, "ServiceMonitor")["spec"]["endpoints"][0].pop("metricRelabelings")

    def keep_exported(objs):
        ep = one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
        ep["metricRelabelings"] = [r for r in ep["metricRelabelings"]
                                   if r.get("action") != "labeldrop"]

    def no_runbook(objs):
        first_alert(objs)["annotations"].pop("runbook_url")

    def bad_anchor(objs):
        a = first_alert(objs)["annotations"]
        a["runbook_url"] = a["runbook_url"].rsplit("#", 1)[0] + "#nowhere"

    def no_base(objs):
        a = first_alert(objs)["annotations"]
        a["runbook_url"] = re.sub(r"^.*?(deploy/README\.md#)", r"\1", a["runbook_url"])

    def no_down(objs):
        for g in one(objs, "PrometheusRule")["spec"]["groups"]:
            g["rules"] = [r for r in g["rules"] if r.get("alert") != "StagewiseCoordinatorDown"]

    def no_sidecar_label(objs):
        del one(objs, "ConfigMap")["metadata"]["labels"]["grafana_dashboard"]

    def stale_copy(objs):
        cm = one(objs, "ConfigMap")
        k = [k for k in cm["data"] if k.endswith(".json")][0]
        d = json.loads(cm["data"][k])
        d["panels"] = d["panels"][1:]
        cm["data"][k] = json.dumps(d)

    # name: (breakage, what the report must say)
    return {"ServiceMonitor without release": (no_release, "no `release` label"),
            "ServiceMonitor honouring labels": (honor, "honours labels"),
            "no exported_job -> job_id relabelling": (no_relabel, "expected job_id=job-7"),
            "exported_job kept": (keep_exported, "no exported_job"),
            "alert without runbook_url": (no_runbook, "has no runbook_url"),
            "runbook anchor missing from deploy/README.md": (bad_anchor, "#nowhere is no section"),
            "runbook_url without runbook_base (a repository path)": (no_base, "is not a URL"),
            "no StagewiseCoordinatorDown": (no_down, "no StagewiseCoordinatorDown"),
            "dashboard ConfigMap without the sidecar label": (no_sidecar_label,
                                                              "without the label grafana_dashboard"),
            "dashboard ConfigMap unlike deploy/grafana/dashboards": (stale_copy, "differs from")}
