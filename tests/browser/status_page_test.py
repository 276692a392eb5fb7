#!/usr/bin/env python3
"""ctest -L browser: the coordinator's status pages in a real browser.

  status_page_test.py SOURCE_DIR BINARY_DIR [SCREENSHOT_DIR]

1. `stagewise local` trains a 2-stage MLP on Fashion-MNIST (evaluation
   every 25 steps, a trace, checkpoints) with `--web` (HTTPS, throw-away
   certificate).
2. Once the job has evaluated a few times, headless Chromium (Debian's
   `chromium`) loads the jobs, workers and job pages; the DOM it built must
   show the job's row, both workers, curves with points (train loss and
   accuracy), one timeline track per stage, the busy/idle table, the events
   and the checkpoints, and the jobs page the cluster's goodput panel (a bar
   of worker-seconds by use, productive time drawn). Screenshots of the three pages go to SCREENSHOT_DIR
   (default: a temporary directory; docs/images holds the committed ones,
   `STAGEWISE_UPDATE_SCREENSHOTS=1` writes there).
3. A coordinator with --tokens: no token is 401 with the sign-in form, a
   read token (header or sign-in cookie) opens the pages, a wrong one does not.
4. A coordinator with HTTPS pages and --tls-reload-seconds 1 whose CA bundle,
   certificate and key are replaced by ones of a new CA (deploy/k8s/make-secrets
   twice): the pages serve the new certificate without a restart.
Stops everything (SIGINT to `stagewise local`, as Ctrl-C). Exit 77: no chromium.
"""
import html.parser
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SOURCE, BINARY = sys.argv[1], sys.argv[2]
BIN = os.path.join(BINARY, "bin")
JOB = """name: fmnist-status-page
seed: 1
model: {name: mlp, hidden: [128, 64]}
data: {dataset: fashion_mnist, limit_test: 1000}
optimizer: {name: sgd, lr: 0.02, momentum: 0.9}
batch_size: 64
stages: 2
steps: 100000
eval: {every_steps: 25}
trace: {steps: [0, 40]}
checkpoint: {dir: CKPT, every_steps: 100, keep: 2}
"""


# Evaluations before the pages are checked (STAGEWISE_SCREENSHOT_EVALS: more
# for the committed screenshots' curves).
MIN_EVALS = int(os.environ.get("STAGEWISE_SCREENSHOT_EVALS", "4"))


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


INSECURE = ssl.create_default_context()
INSECURE.check_hostname = False
INSECURE.verify_mode = ssl.CERT_NONE


def fetch(url, headers=None, data=None):
    """(status, body, headers) without following redirects."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=INSECURE), NoRedirect)
    req = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


class Dom(html.parser.HTMLParser):
    """The elements of a page: (tag, attrs) in document order, plus the
    element stack so that tracks can be counted inside the timeline."""

    def __init__(self, text):
        super().__init__()
        self.elements = []
        self.stack = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a, [t for t, _ in self.stack]))
        if tag not in ("meta", "rect", "circle", "polyline", "input", "br", "path", "line"):
            self.stack.append((tag, a))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def find(self, tag, **attrs):
        return [a for t, a, _ in self.elements
                if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def browser_dom(browser, url, profile):
    out = subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors",
         f"--user-data-dir={profile}", "--virtual-time-budget=3000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or "<html" not in out.stdout:
        raise AssertionError(f"chromium --dump-dom {url}: rc {out.returncode}\n{out.stderr[-2000:]}")
    return out.stdout


def screenshot(browser, url, path, profile, height=1000):
    out = subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors",
         f"--user-data-dir={profile}", "--hide-scrollbars", f"--window-size=1280,{height}",
         f"--screenshot={path}", url],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or not os.path.exists(path) or os.path.getsize(path) < 5000:
        raise AssertionError(f"chromium --screenshot {url}: rc {out.returncode}\n{out.stderr[-2000:]}")


def check(cond, message, failures):
    print(("ok   " if cond else "FAIL ") + message)
    if not cond:
        failures.append(message)


SHORT_JOB = """name: short-no-trace
seed: 2
model: {name: mlp, hidden: [32]}
data: {dataset: synthetic, train_size: 512, test_size: 128, shape: [1, 8, 8], classes: 4}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 32
steps: 60
stages: 2
eval: {every_steps: 20}
"""


def after_the_end_part(browser, tmp, failures):
    """`local --web` keeps the pages up after its job ended (until Ctrl-C),
    and a job without a trace section still gets a timeline: the browser
    finds the final curves and both tracks; Ctrl-C then ends it with the
    job's exit code."""
    job = os.path.join(tmp, "short.yaml")
    with open(job, "w") as f:
        f.write(SHORT_JOB)
    port = free_port()
    log_path = os.path.join(tmp, "short.log")
    log = open(log_path, "w")
    local = subprocess.Popen([os.path.join(BIN, "stagewise"), "local", job, "--web", f"127.0.0.1:{port}"],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and "stay up" not in open(log_path).read():
            if local.poll() is not None:
                break
            time.sleep(0.5)
        text = open(log_path).read()
        m = re.search(r"/jobs/(job-[0-9a-f]+)", text)
        check(m is not None and local.poll() is None,
              "local --web: the job ended and the pages stay up", failures)
        if m is None:
            print(text[-3000:])
            return
        page = Dom(browser_dom(browser, f"https://127.0.0.1:{port}/jobs/{m.group(1)}",
                               os.path.join(tmp, "chromium-profile-2")))
        summary = "".join(a.get("class", "") for a in page.find("td"))
        check("SUCCEEDED" in summary, "after the end: the job page says SUCCEEDED", failures)
        series = {a.get("data-series"): int(a.get("data-points", "0")) for a in page.find("polyline")}
        check(series.get("eval_accuracy", 0) >= 3,
              f"after the end: the final accuracy curve (every evaluation: {series})", failures)
        tracks = [a for t, a, parents in page.elements
                  if t == "g" and a.get("class") == "track" and "svg" in parents]
        check(len(tracks) == 2, f"after the end: a timeline without a trace section ({len(tracks)} tracks)",
              failures)
        base = f"https://127.0.0.1:{port}"
        status, body, _ = fetch(f"{base}/api/v1/jobs/{m.group(1)}")
        job = json.loads(body) if status == 200 else {}
        check(job.get("job_id") == m.group(1) and job.get("state") == "SUCCEEDED" and
              job.get("step") == "60",
              f"API: /api/v1/jobs/ID is the ended job ({status} {body[:300]})", failures)
        status, body, _ = fetch(f"{base}/api/v1/jobs")
        check(status == 200 and [j["job_id"] for j in json.loads(body)["jobs"]] == [m.group(1)],
              "API: /api/v1/jobs lists it", failures)
        status, body, _ = fetch(f"{base}/api/v1/workers")
        check(status == 200 and len(json.loads(body)["workers"]) == 2, "API: /api/v1/workers", failures)
        os.killpg(local.pid, signal.SIGINT)
        rc = local.wait(timeout=60)
        check(rc == 0, f"Ctrl-C after the end: the job's exit code 0 (got {rc})", failures)
    finally:
        if local.poll() is None:
            os.killpg(local.pid, signal.SIGKILL)
            local.wait()


def tokens_part(tmp, failures):
    """A coordinator with --tokens: the pages need a read token."""
    secret = "reader-0123456789abcdef"
    tokens = os.path.join(tmp, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{secret} read viewer\n")
    os.chmod(tokens, 0o600)
    port = free_port()
    log = open(os.path.join(tmp, "tokens-coordinator.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(BIN, "stagewise-coordinator"), "--listen", "127.0.0.1:0", "--metrics-listen", "",
         "--db", os.path.join(tmp, "tokens.db"), "--tokens", tokens, "--web-listen", f"127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                fetch(base + "/login")
                break
            except OSError:
                time.sleep(0.1)
        status, body, _ = fetch(base + "/")
        check(status == 401 and 'name="token"' in body, "no token: 401 and the sign-in form", failures)
        status, _, _ = fetch(base + "/workers", {"Authorization": "Bearer " + secret})
        check(status == 200, "a read token in the Authorization header opens /workers", failures)
        status, _, _ = fetch(base + "/", {"Authorization": "Bearer wrong-0123456789abcdef"})
        check(status == 401, "an unknown token is 401", failures)
        status, _, headers = fetch(base + "/login", data=urllib.parse.urlencode({"token": secret}).encode())
        cookie = (headers.get("Set-Cookie") or "").split(";")[0]
        check(status == 303 and cookie.startswith("stagewise_token=") and
              "HttpOnly" in (headers.get("Set-Cookie") or ""),
              "signing in sets an HttpOnly cookie and redirects", failures)
        status, _, _ = fetch(base + "/", {"Cookie": cookie})
        check(status == 200, "the cookie opens the jobs page", failures)
        status, _, _ = fetch(base + "/login", data=b"token=wrong-0123456789abcdef")
        check(status == 401, "signing in with an unknown token is refused", failures)
        # The JSON API behind the same tokens.
        status, body, headers = fetch(base + "/api/v1/jobs")
        check(status == 401 and json.loads(body)["error"]["code"] == 401 and
              "json" in (headers.get("Content-Type") or ""),
              "API without a token: 401 as JSON", failures)
        auth = {"Authorization": "Bearer " + secret}
        status, body, _ = fetch(base + "/api/v1/jobs", auth)
        check(status == 200 and json.loads(body) == {"jobs": [], "next_page_token": ""},
              f"API with a read token: /api/v1/jobs ({status} {body[:200]})", failures)
        status, body, _ = fetch(base + "/api/v1/workers", auth)
        check(status == 200 and json.loads(body) == {"workers": []},
              f"API: /api/v1/workers ({status} {body[:200]})", failures)
        status, body, _ = fetch(base + "/api/v1/jobs/job-00000000", auth)
        check(status == 404 and "job-00000000" in json.loads(body)["error"]["message"],
              f"API: an unknown job is 404 naming it ({status} {body[:200]})", failures)
        status, body, _ = fetch(base + "/api/v1/nosuch", auth)
        check(status == 404 and "/api/v1/workers" in json.loads(body)["error"]["message"],
              "API: an unknown resource is 404 listing the resources", failures)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def rotation_part(tmp, failures):
    """HTTPS pages of a coordinator whose certificate rotates to a new CA
    (--tls-reload-seconds 1): served without a restart."""
    make = os.path.join(SOURCE, "deploy", "k8s", "make-secrets")
    pki_a, pki_b, live = (os.path.join(tmp, n) for n in ("pki-a", "pki-b", "live"))
    for d in (pki_a, pki_b):
        subprocess.run(["bash", make, d], check=True, capture_output=True)
    os.makedirs(live)
    for f in ("ca.pem", "coordinator.pem", "coordinator.key"):
        shutil.copy(os.path.join(pki_a, f), os.path.join(live, f))

    def replace(name, text):  # a temporary file, then rename
        with open(os.path.join(live, name + ".new"), "w") as f:
            f.write(text)
        os.chmod(os.path.join(live, name + ".new"), 0o600)
        os.rename(os.path.join(live, name + ".new"), os.path.join(live, name))

    def handshake(ca):
        context = ssl.create_default_context(cafile=ca)
        context.check_hostname = False  # the certificates name stagewise.cluster
        try:
            with urllib.request.urlopen(base + "/", context=context, timeout=10) as r:
                return r.status == 200
        except (urllib.error.URLError, ssl.SSLError, ConnectionError):
            return False

    port = free_port()
    base = f"https://127.0.0.1:{port}"
    log = open(os.path.join(tmp, "rotation-coordinator.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(BIN, "stagewise-coordinator"), "--listen", "127.0.0.1:0", "--metrics-listen", "",
         "--db", os.path.join(tmp, "rotation.db"), "--web-listen", f"127.0.0.1:{port}",
         "--tls-cert", os.path.join(live, "coordinator.pem"), "--tls-key",
         os.path.join(live, "coordinator.key"), "--tls-ca", os.path.join(live, "ca.pem"),
         "--tls-reload-seconds", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if handshake(os.path.join(pki_a, "ca.pem")):
                break
            time.sleep(0.1)
        check(handshake(os.path.join(pki_a, "ca.pem")), "HTTPS with the first CA's certificate", failures)
        check(not handshake(os.path.join(pki_b, "ca.pem")),
              "a client that trusts only the second CA is refused before the rotation", failures)
        read = lambda d, f: open(os.path.join(d, f)).read()
        replace("ca.pem", read(pki_a, "ca.pem") + read(pki_b, "ca.pem"))
        replace("coordinator.key", read(pki_b, "coordinator.key"))
        replace("coordinator.pem", read(pki_b, "coordinator.pem"))
        ok = False
        for _ in range(50):
            ok = handshake(os.path.join(pki_b, "ca.pem"))
            if ok:
                break
            time.sleep(0.2)
        check(ok, "after the rotation the pages serve the second CA's certificate (no restart)", failures)
        check(not handshake(os.path.join(pki_a, "ca.pem")),
              "and no longer the first one's", failures)
        check(proc.poll() is None, "the coordinator kept running", failures)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main():
    browser = chromium()
    if browser is None:
        print("skipped: no chromium (apt-get install chromium)")
        return 77
    failures = []
    tmp = tempfile.mkdtemp(prefix="stagewise-browser-")
    shots = (os.path.join(SOURCE, "docs", "images") if os.environ.get("STAGEWISE_UPDATE_SCREENSHOTS")
             else (sys.argv[3] if len(sys.argv) > 3 else os.path.join(tmp, "screenshots")))
    os.makedirs(shots, exist_ok=True)
    local = None
    try:
        tokens_part(tmp, failures)
        rotation_part(tmp, failures)
        after_the_end_part(browser, tmp, failures)

        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB.replace("CKPT", os.path.join(tmp, "ckpt")))
        port = free_port()
        log = open(os.path.join(tmp, "local.log"), "w")
        local = subprocess.Popen([os.path.join(BIN, "stagewise"), "local", job, "--web", f"127.0.0.1:{port}"],
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"https://127.0.0.1:{port}"
        # Wait for the job to have evaluated a few times and checkpointed.
        job_id, deadline = None, time.time() + 240
        while time.time() < deadline:
            if local.poll() is not None:
                raise AssertionError("stagewise local ended:\n" + open(log.name).read()[-3000:])
            try:
                status, body, _ = fetch(base + "/")
            except OSError:
                time.sleep(0.5)
                continue
            m = re.search(r'id="job-([^"]+)"', body)
            if m:
                job_id = m.group(1)
                _, page, _ = fetch(f"{base}/jobs/{job_id}")
                acc = re.search(r'data-series="eval_accuracy" data-points="(\d+)"', page)
                if acc and int(acc.group(1)) >= MIN_EVALS and 'id="checkpoints"' in page:
                    break
            time.sleep(1)
        check(job_id is not None, "the job appears on the jobs page", failures)
        if job_id is None:
            return 1
        profile = os.path.join(tmp, "chromium-profile")

        jobs = Dom(browser_dom(browser, base + "/", profile))
        check(bool(jobs.find("tr", id=f"job-{job_id}")), "jobs page (browser DOM): the job's row", failures)
        check(any(a.get("value") for a in jobs.find("progress")), "jobs page: a progress bar", failures)
        uses = {a.get("data-use"): float(a.get("width", "0")) for t, a, parents in jobs.elements
                if t == "rect" and "svg" in parents and a.get("data-use")}
        check(len(uses) == 7 and uses.get("productive", 0) > 0,
              f"jobs page: the goodput panel's bar, productive time drawn ({uses})", failures)
        check(bool(jobs.find("table", id="goodput-uses")), "jobs page: the goodput figures", failures)

        workers = Dom(browser_dom(browser, base + "/workers", profile))
        rows = [a for a in workers.find("tr") if a.get("class") == "worker"]
        check(len(rows) == 2, f"workers page: 2 worker rows (got {len(rows)})", failures)

        page = Dom(browser_dom(browser, f"{base}/jobs/{job_id}", profile))
        series = {a.get("data-series"): int(a.get("data-points", "0")) for a in page.find("polyline")}
        check(series.get("train_loss", 0) >= 2, f"job page: the train loss curve has points ({series})", failures)
        check(series.get("eval_accuracy", 0) >= 4,
              "job page: the accuracy curve has a point per evaluation", failures)
        polylines = page.find("polyline", data_series="train_loss")
        check(bool(polylines) and len(polylines[0].get("points", "").split()) >= 2,
              "job page: the loss polyline's points are drawn", failures)
        tracks = [a for t, a, parents in page.elements
                  if t == "g" and a.get("class") == "track" and "svg" in parents]
        check(len(tracks) == 2 and {a.get("data-stage") for a in tracks} == {"0", "1"},
              f"job page: one timeline track per stage (got {len(tracks)})", failures)
        rects = [a for t, a, parents in page.elements if t == "rect" and "g" in parents]
        check(len(rects) >= 4, f"job page: the tracks hold spans ({len(rects)})", failures)
        check(bool(page.find("table", id="load")), "job page: busy/idle per stage", failures)
        check(bool(page.find("table", id="events")), "job page: the event log", failures)
        check(bool(page.find("table", id="checkpoints")), "job page: the checkpoints", failures)

        screenshot(browser, base + "/", os.path.join(shots, "status-jobs.png"), profile, 640)
        screenshot(browser, base + "/workers", os.path.join(shots, "status-workers.png"), profile, 320)
        screenshot(browser, f"{base}/jobs/{job_id}", os.path.join(shots, "status-job.png"), profile, 1400)
        check(True, f"screenshots in {shots}", failures)
    finally:
        if local is not None and local.poll() is None:
            os.killpg(local.pid, signal.SIGINT)
            try:
                local.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(local.pid, signal.SIGKILL)
                local.wait()
        if failures and os.path.exists(os.path.join(tmp, "local.log")):
            print(open(os.path.join(tmp, "local.log")).read()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if not failures else f"FAILED: {len(failures)} check(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
