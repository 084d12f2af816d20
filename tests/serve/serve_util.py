"""Starting and stopping `slope serve` for the serve tests: a server on a free port, its
stdout's "listening on" line awaited, its stderr kept in a file for the failure message."""
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time


class Server:
    def __init__(self, slope, model, instances, extra=(), name="tiny", dtype="f32"):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="slope-serve-", suffix=".log", delete=False)
        cmd = [slope, "serve", "--model", model, "--port", "0", "--dtype", dtype, "--threads-per-rank", "1",
               "--served-model-name", name]
        for m in instances:
            cmd += ["--instance", m]
        cmd += list(extra)
        self.name = name
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()  # printed once every instance is ready
        if "listening on http://" not in line:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"slope serve did not start (exit {self.proc.returncode}):\n{self.stderr()}")
        self.port = int(line.split("http://")[1].split()[0].rsplit(":", 1)[1])
        self.base = f"http://127.0.0.1:{self.port}"

    def stderr(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """(status, headers, parsed JSON or text) of one request on a fresh connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(text)
        except json.JSONDecodeError:
            return r.status, dict(r.getheaders()), text

    def stop(self, timeout=60):
        """SIGTERM: the server drains and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("slope serve did not exit within %d s of SIGTERM" % timeout)
        return self.proc.returncode

    def wait_health(self, pred, timeout, headers=None):
        end = time.time() + timeout
        while time.time() < end:
            try:
                _, _, h = self.request("GET", "/health", headers=headers, timeout=5)
                if isinstance(h, dict) and pred(h):
                    return h
            except OSError:
                pass
            time.sleep(0.2)
        return None


def cleanup(path):
    try:
        os.unlink(path)
    except OSError:
        pass
