"""Start and stop the two servers under test as separate processes."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.launch import PRELOADED

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0


def gpu_webhook(*args: str) -> str:
    """The output of a ``gpu-webhook`` command (the installed script, or the module when
    the environment has none)."""
    exe = Path(sys.executable).with_name("gpu-webhook")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "webhook.cli"]
    out: str = subprocess.run([*cmd, *args], check=True, capture_output=True, text=True,
                              cwd=ROOT).stdout
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far. Per request, it
        is the cost that waiting for a CPU on a busy machine does not inflate."""
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=25)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _ready(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, \
                ctx.wrap_socket(raw) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def start(name: str, module: str, args: list[str], log: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = Server(name, proc, port, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log.read_text()}")
        if _ready(port):
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{name} did not answer /healthz in {START_TIMEOUT:.0f} s:\n"
                       f"{log.read_text()}")


def start_ours(cert_dir: Path, policy: Path, preload: int, log: Path) -> Server:
    server = start("gpu-webhook", "bench.launch",
                   ["--cert-dir", str(cert_dir), "--policy", str(policy),
                    "--preload", str(preload)], log)
    if PRELOADED.format(n=preload) not in log.read_text():
        server.stop()
        raise RuntimeError("gpu-webhook started without the preloaded usage store: "
                           "webhook.server.run.run no longer builds a MemoryStore; update "
                           "bench/launch.py")
    return server


def start_baseline(cert_dir: Path, log: Path) -> Server:
    return start("baseline", "bench.baseline", ["--cert-dir", str(cert_dir)], log)
