"""Shared by the fault tests (test_faults.py, test_link_cut.py): a steady load of client threads
against `slope serve` that records one answer per request sent, the instances' ranks' CPU time
(to tell when an instance is computing), and the checks every fault must pass."""
import http.client
import json
import os
import random
import threading
import time


class Load:
    """`clients` threads, each sending POST /v1/completions one after another with random prompt
    lengths from `lengths`, until stop(). Every request sent gets exactly one record: its status
    (or "client_error" when the client saw no HTTP answer), the instance that served it (200), the
    error message (otherwise), and when it was sent and answered."""

    def __init__(self, port, vocab, lengths, clients=3, seed=1, timeout=120, headers=None):
        self.port, self.vocab, self.lengths, self.timeout = port, vocab, lengths, timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.records, self.sent = [], 0
        self.mu = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(seed * 100 + c,), daemon=True)
                        for c in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, seed):
        rng = random.Random(seed)
        while not self.stopping.is_set():
            n = rng.choice(self.lengths)
            ids = [rng.randrange(self.vocab) for _ in range(n)]
            with self.mu:
                self.sent += 1
            rec = {"sent": time.time(), "tokens": n}
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                c.request("POST", "/v1/completions", body=json.dumps({"prompt": ids}), headers=self.headers)
                r = c.getresponse()
                text = r.read().decode("utf-8", "replace")
                c.close()
                rec["status"] = r.status
                try:
                    j = json.loads(text)
                except json.JSONDecodeError:
                    j = {"error": {"message": text}}
                if r.status == 200:
                    rec["instance"] = j["slope"]["instance"]
                else:
                    rec["message"] = j.get("error", {}).get("message", text)
                    rec["code"] = j.get("error", {}).get("code", "")
            except Exception as e:  # noqa: BLE001 (every failure to get an answer is counted)
                rec["status"] = "client_error"
                rec["message"] = f"{type(e).__name__}: {e}"
            rec["answered"] = time.time()
            with self.mu:
                self.records.append(rec)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=self.timeout + 10)
        return not any(t.is_alive() for t in self.threads)

    def snapshot(self):
        with self.mu:
            return list(self.records)

    def counts(self):
        recs = self.snapshot()
        out = {"sent": self.sent, "answered": len(recs), "200": 0, "429": 0, "5xx": 0, "other": 0, "client_error": 0}
        for r in recs:
            s = r["status"]
            key = "client_error" if s == "client_error" else "200" if s == 200 else "429" if s == 429 \
                else "5xx" if 500 <= s < 600 else "other"
            out[key] += 1
        return out


def cpu_seconds(pid):
    """CPU time of a process's main thread (the one that computes, with one OpenMP thread per
    rank), seconds, from /proc/PID/schedstat (nanoseconds; /proc/PID/stat counts 10 ms ticks).
    None when it is gone."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def wait_busy(pids, timeout, window=0.05, min_cpu=0.005):
    """Waits until every process in `pids` used at least `min_cpu` s of CPU within one `window`
    (the instance is computing a prefill: an idle rank polling its peers uses under 1% of a
    core, a computing one 20-50% on a busy 2-core machine). True when seen within `timeout`."""
    end = time.time() + timeout
    while time.time() < end:
        before = [cpu_seconds(p) for p in pids]
        time.sleep(window)
        after = [cpu_seconds(p) for p in pids]
        if None in before or None in after:
            return False
        if all(a - b >= min_cpu for a, b in zip(after, before)):
            return True
    return False


def wait_idle(pids, timeout, window=0.2, max_cpu=0.004):
    end = time.time() + timeout
    while time.time() < end:
        before = [cpu_seconds(p) for p in pids]
        time.sleep(window)
        after = [cpu_seconds(p) for p in pids]
        if None in before or None in after:
            return False
        if all(a - b <= max_cpu for a, b in zip(after, before)):
            return True
    return False


def names_instance(message, mesh):
    """A 5xx's message names the instance that failed: "instance pp=1,ring=2,... failed ..."."""
    return f"instance {mesh}" in (message or "")
