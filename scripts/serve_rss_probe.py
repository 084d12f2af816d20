#!/usr/bin/env python3
"""Memory of a long-lived `slope serve` instance, request after request (docs/serving.md).

Starts `slope serve` with one instance on MODEL, sends N completions one after another with
prompt lengths cycling through LENGTHS (random ids, fixed seed), and every EVERY requests prints
the request count and the instance's resident memory as /metrics reports it
(slope_instance_resident_memory_bytes, read by the ranks after their pass). Standard library only.

  scripts/serve_rss_probe.py --model /tmp/models/serve-1l --requests 400 --lengths 256,8192,512,4096,1024,2048
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--model", required=True)
ap.add_argument("--slope", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "release", "slope"))
ap.add_argument("--instance", default="ring=1")
ap.add_argument("--threads-per-rank", default="2")
ap.add_argument("--requests", type=int, default=400)
ap.add_argument("--lengths", default="256,8192,512,4096,1024,2048")
ap.add_argument("--every", type=int, default=25)
a = ap.parse_args()

vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
lengths = [int(x) for x in a.lengths.split(",")]
log = tempfile.NamedTemporaryFile("w+", prefix="slope-rss-probe-", suffix=".log", delete=False)
server = subprocess.Popen([a.slope, "serve", "--model", a.model, "--instance", a.instance, "--threads-per-rank",
                           a.threads_per_rank, "--port", "0", "--slo-ms", "1000000", "--batch-tokens", "0"],
                          stdout=log, stderr=subprocess.STDOUT)
url = None
for _ in range(3000):
    m = re.search(r"listening on (http://\S+)", open(log.name).read())
    if m:
        url = m.group(1)
        break
    if server.poll() is not None:
        sys.exit(f"slope serve exited with {server.returncode}:\n{open(log.name).read()}")
    time.sleep(0.1)
if url is None:
    server.kill()
    sys.exit(f"slope serve did not start listening; its log is {log.name}")


def instance_rss_mib():
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return float(re.search(r"slope_instance_resident_memory_bytes\{[^}]*\} (\S+)", text).group(1)) / 2**20


rng = random.Random(1)
print("requests,instance_rss_mib")
try:
    for i in range(a.requests + 1):
        if i % a.every == 0:
            print(f"{i},{instance_rss_mib():.0f}", flush=True)
        if i == a.requests:
            break
        n = lengths[i % len(lengths)]
        body = json.dumps({"model": os.path.basename(os.path.normpath(a.model)), "max_tokens": 1,
                           "prompt": [rng.randrange(vocab) for _ in range(n)]}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()
finally:
    server.terminate()
    server.wait()
