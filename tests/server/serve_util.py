"""Starts `pagellm serve` for the server tests: a tiny model made once per session, a free
port chosen by the server (--port 0) and read from its start-up line."""
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

PAGELLM = os.environ.get("PAGELLM_BIN", os.path.join(os.path.dirname(__file__), "../../build/pagellm"))


def make_tiny_model(folder):
    subprocess.run([PAGELLM, "make-model", "--preset", "tiny", "--out", folder], check=True,
                   stdout=subprocess.DEVNULL)
    return folder


class Served:
    """One `pagellm serve` process; .url is its base URL."""

    # The tests' engine: small, so that 64 concurrent streams fit and pages are counted fast.
    TEST_ENGINE = ("--max-model-len", "256", "--num-pages", "1200", "--max-num-seqs", "64")

    def __init__(self, model_dir, *extra, engine=TEST_ENGINE):
        self.model_dir = model_dir
        self.log = tempfile.NamedTemporaryFile("w+", prefix="pagellm-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [os.environ.get("PAGELLM_BIN", PAGELLM), "serve", "--model", model_dir, "--port", "0",
             *engine, *extra],
            stdout=self.log, stderr=self.log)
        deadline = time.time() + 60
        self.url = None
        while time.time() < deadline and self.url is None:
            if self.proc.poll() is not None:
                raise RuntimeError("pagellm serve exited: " + self.output())
            m = re.search(r"on (http://[\d.]+:\d+)", self.output())
            if m:
                self.url = m.group(1)
            else:
                time.sleep(0.05)
        if self.url is None:
            raise RuntimeError("pagellm serve did not start: " + self.output())

    def output(self):
        with open(self.log.name) as f:
            return f.read()

    def call(self, method, path, body=None, headers=None, timeout=60):
        """(status, parsed JSON or text) of one request."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def wait_idle(self, timeout=20):
        """Waits until nothing runs and every KV page is free; returns /health."""
        deadline = time.time() + timeout
        while True:
            _, h = self.call("GET", "/health")
            if (h["free_pages"] == h["usable_pages"] and h["running"] == 0 and h["waiting"] == 0
                    and h["unfinished_requests"] == 0):
                return h
            if time.time() > deadline:
                raise AssertionError(f"not idle after {timeout} s: {h}")
            time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("pagellm serve did not stop on SIGTERM: " + self.output())
        return code
