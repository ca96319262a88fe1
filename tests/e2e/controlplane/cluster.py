"""A real Kubernetes control plane (etcd + kube-apiserver, and optionally kube-scheduler,
kube-controller-manager and kwok) for e2e tests.

The binaries come from ``build.sh`` next to this file (built from the Go module
proxy and cached outside the work tree). Everything here uses the standard
library plus the ``openssl`` command line tool, so it works before the project's
own dependencies are installed.

Typical use::

    from tests.e2e.controlplane.cluster import ControlPlane, build_binaries

    with ControlPlane(build_binaries(), work_dir) as cp:
        cp.kubectl("get", "ns")            # admin (system:masters) credentials
        cert, key = cp.issue_serving_cert("webhook", ["127.0.0.1", "localhost"])
        # ... register a webhook with clientConfig.url=https://127.0.0.1:<port>/...
        #     and caBundle=cp.ca_bundle_b64

By default there are no nodes, no scheduler and no controller-manager: objects
are stored and admitted (including by admission webhooks), nothing is run. The
ServiceAccount admission plugin is disabled since no controller creates the
default service accounts (and stays disabled with the controllers, so that a pod
created right after its namespace never races the "default" account's creation).

``ControlPlane(..., components=SIMULATED)`` adds what makes it a cluster:

- kube-scheduler (identity ``system:kube-scheduler``, as kubeadm sets it up) binds
  pods to nodes, DRA claims included;
- kube-controller-manager (``system:kube-controller-manager`` with
  ``--use-service-account-credentials``: each controller acts as its own service
  account, as in a kubeadm cluster) runs the default controllers: ReplicaSets,
  Deployments, Jobs, namespace deletion, garbage collection, node lifecycle, the
  resourceclaim controller;
- kwok plays the kubelet of every Node annotated ``kwok.x-k8s.io/node=fake`` (and only
  those), with the Stages in ``kwok-stages.yaml``: nodes become Ready and renew their
  leases, pods bound to them run, a Job's pods complete, a pod past its
  ``activeDeadlineSeconds`` fails (as the kubelet ends it), deleted pods go away.

    with ControlPlane(build_binaries(), work_dir, components=SIMULATED) as cp:
        cp.kubectl("apply", "-f", "nodes.yaml")   # kwok fake nodes

Smoke test::

    python tests/e2e/controlplane/cluster.py [BIN_DIR]
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
KWOK_STAGES = HERE / "kwok-stages.yaml"
LOOPBACK = "127.0.0.1"

SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
KWOK = "kwok"
# Everything a simulated cluster needs besides etcd and the API server.
SIMULATED = (SCHEDULER, CONTROLLER_MANAGER, KWOK)
# kwok manages the nodes carrying this annotation, and only them.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started."""


def build_binaries(timeout: float | None = None) -> Path:
    """Run build.sh (a no-op when the binaries are cached) and return the bin dir."""
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    return Path(lines[-1])


def free_port() -> int:
    """A TCP port on the loopback address that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


class _Openssl:
    """Certificates and keys through the openssl CLI."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        if shutil.which("openssl") is None:
            raise ControlPlaneError("the openssl command is needed to make certificates")

    def _run(self, *args: str) -> None:
        proc = subprocess.run(
            ["openssl", *args],
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stdout}")

    def _config(self, name: str, cn: str, org: str | None, ext: dict[str, str]) -> Path:
        dn = [f"CN = {cn}"] + ([f"O = {org}"] if org else [])
        body = [
            "[req]",
            "distinguished_name = dn",
            "prompt = no",
            "[dn]",
            *dn,
            "[ext]",
            *(f"{k} = {v}" for k, v in ext.items()),
        ]
        path = self.dir / f"{name}.cnf"
        path.write_text("\n".join(body) + "\n")
        return path

    def ca(self, name: str, cn: str) -> tuple[Path, Path]:
        cfg = self._config(
            name,
            cn,
            None,
            {
                "basicConstraints": "critical,CA:TRUE",
                "keyUsage": "critical,digitalSignature,keyCertSign,cRLSign",
                "subjectKeyIdentifier": "hash",
            },
        )
        crt, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        self._run(
            "req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-sha256",
            "-days", "3650", "-keyout", str(key), "-out", str(crt),
            "-config", str(cfg), "-extensions", "ext",
        )  # fmt: skip
        return crt, key

    def leaf(
        self,
        name: str,
        ca: tuple[Path, Path],
        cn: str,
        *,
        org: str | None = None,
        hosts: list[str] | None = None,
        server: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        usages = (["serverAuth"] if server else []) + (["clientAuth"] if client else [])
        ext = {
            "basicConstraints": "critical,CA:FALSE",
            "keyUsage": "critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage": ",".join(usages),
            "subjectKeyIdentifier": "hash",
            "authorityKeyIdentifier": "keyid,issuer",
        }
        if hosts:
            ext["subjectAltName"] = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)
        cfg = self._config(name, cn, org, ext)
        crt, key, csr = (self.dir / f"{name}.{s}" for s in ("crt", "key", "csr"))
        self._run(
            "req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(key),
            "-out", str(csr), "-config", str(cfg),
        )  # fmt: skip
        self._run(
            "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
            "-set_serial", str(secrets.randbits(63)), "-days", "365", "-sha256",
            "-extfile", str(cfg), "-extensions", "ext", "-out", str(crt),
        )  # fmt: skip
        csr.unlink()
        return crt, key

    def keypair(self, name: str) -> tuple[Path, Path]:
        key, pub = self.dir / f"{name}.key", self.dir / f"{name}.pub"
        self._run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                  "-out", str(key))  # fmt: skip
        self._run("pkey", "-in", str(key), "-pubout", "-out", str(pub))
        return key, pub


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports, with admin credentials.

    Attributes once started: ``kubeconfig`` (Path), ``server`` (https URL),
    ``version`` (the apiserver's gitVersion), ``ca_cert``/``ca_key`` (the cluster
    CA, also usable to sign webhook serving certs), ``ca_bundle_b64``.
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str],
        work_dir: str | os.PathLike[str] | None = None,
        *,
        extra_apiserver_args: list[str] | None = None,
        start_timeout: float = 120.0,
        components: tuple[str, ...] | list[str] = (),
        component_args: dict[str, list[str]] | None = None,
        kwok_config: str | os.PathLike[str] = KWOK_STAGES,
    ) -> None:
        self.bin_dir = Path(bin_dir).resolve()
        unknown = sorted(set(components) - set(SIMULATED))
        if unknown:
            raise ControlPlaneError(f"unknown components {unknown}: choose from {SIMULATED}")
        # Started in this order (the controllers before kwok, so that the node
        # lifecycle controller is watching when kwok's nodes first report Ready).
        self.components = [c for c in SIMULATED if c in components]
        # A component that is asked for and missing fails here: a test never quietly
        # runs on less of a cluster than it asked for.
        for b in ("etcd", "kube-apiserver", "kubectl", *self.components):
            if not os.access(self.bin_dir / b, os.X_OK):
                raise ControlPlaneError(f"{self.bin_dir / b} missing: run {BUILD_SCRIPT}")
        self.component_args = {k: list(v) for k, v in (component_args or {}).items()}
        self.kwok_config = Path(kwok_config).resolve()
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="gpu-webhook-cp-")).resolve()
        self.extra_apiserver_args = list(extra_apiserver_args or [])
        self.start_timeout = start_timeout

        self.pki_dir = self.work_dir / "pki"
        self.etcd_log = self.work_dir / "etcd.log"
        self.apiserver_log = self.work_dir / "kube-apiserver.log"
        self.kubeconfig = self.work_dir / "kubeconfig"
        self.etcd_url = ""
        self.server = ""
        self.version = ""
        self.apiserver_args: list[str] = []
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        # The optional components, by name, in start order.
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.component_ports: dict[str, int] = {}
        self._ssl: ssl.SSLContext | None = None
        self._pki: _Openssl | None = None

    # ------------------------------------------------------------------ setup
    def _make_pki(self) -> None:
        self.pki_dir.mkdir(parents=True, exist_ok=True)
        pki = self._pki = _Openssl(self.pki_dir)
        self.ca_cert, self.ca_key = pki.ca("ca", "gpu-webhook-e2e-ca")
        self.serving_cert, self.serving_key = pki.leaf(
            "apiserver",
            (self.ca_cert, self.ca_key),
            "kube-apiserver",
            hosts=[LOOPBACK, "localhost", "kubernetes", "kubernetes.default",
                   "kubernetes.default.svc", "10.0.0.1"],
            server=True,
        )  # fmt: skip
        self.admin_cert, self.admin_key = pki.leaf(
            "admin", (self.ca_cert, self.ca_key), "admin", org="system:masters", client=True
        )
        self.sa_key, self.sa_pub = pki.keypair("sa")

    def issue_serving_cert(self, name: str, hosts: list[str]) -> tuple[Path, Path]:
        """A serving cert/key signed by the cluster CA (e.g. for a webhook server)."""
        if self._pki is None:
            raise ControlPlaneError("start() the control plane first")
        return self._pki.leaf(name, (self.ca_cert, self.ca_key), hosts[0], hosts=hosts,
                              server=True)  # fmt: skip

    def issue_client_cert(
        self, name: str, user: str, group: str | None = None
    ) -> tuple[Path, Path]:
        """A client cert for ``user`` (CN), in ``group`` (O) if given."""
        if self._pki is None:
            raise ControlPlaneError("start() the control plane first")
        return self._pki.leaf(name, (self.ca_cert, self.ca_key), user, org=group, client=True)

    @property
    def ca_bundle_b64(self) -> str:
        return base64.b64encode(self.ca_cert.read_bytes()).decode()

    def _write_kubeconfig(self, path: Path | None = None, user: str = "admin",
                          cert: Path | None = None, key: Path | None = None) -> Path:
        path = path or self.kubeconfig
        path.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: {self.server}
    certificate-authority: {self.ca_cert}
users:
- name: {user}
  user:
    client-certificate: {cert or self.admin_cert}
    client-key: {key or self.admin_key}
contexts:
- name: e2e
  context:
    cluster: e2e
    user: {user}
current-context: e2e
"""
        )
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------------ start
    def start(self) -> ControlPlane:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._make_pki()
            self._start_etcd()
            self._start_apiserver()
            if self.components:
                self._start_components()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                start_new_session=True,  # a Ctrl-C in a test run is handled by stop()
            )

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        peer_url = f"http://{LOOPBACK}:{peer}"
        args = [
            str(self.bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={self.work_dir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # throwaway test data: skip fsyncs
            "--log-level=warn",
        ]
        self._etcd = self._spawn(args, self.etcd_log)
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if self._etcd.poll() is not None:
                self._fail(f"etcd exited with code {self._etcd.returncode}", self.etcd_log)
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                    body = json.loads(r.read())
                if body.get("health") == "true":
                    return
                last = str(body)
            except (OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.2)
        self._fail(f"etcd not healthy after {self.start_timeout:.0f}s ({last})", self.etcd_log)

    def _start_apiserver(self) -> None:
        port = free_port()
        self.server = f"https://{LOOPBACK}:{port}"
        self.apiserver_args = [
            str(self.bin_dir / "kube-apiserver"),
            f"--advertise-address={LOOPBACK}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--etcd-servers={self.etcd_url}",
            f"--client-ca-file={self.ca_cert}",
            f"--tls-cert-file={self.serving_cert}",
            f"--tls-private-key-file={self.serving_key}",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            # No controller-manager creates the "default" ServiceAccount.
            "--disable-admission-plugins=ServiceAccount",
            # A loopback advertise address is not a valid Endpoints address:
            # don't maintain the kubernetes service's endpoints at all.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.pki_dir}",
            "--allow-privileged=true",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]
        self._apiserver = self._spawn(self.apiserver_args, self.apiserver_log)
        self._ssl = ssl.create_default_context(cafile=str(self.ca_cert))
        self._ssl.load_cert_chain(str(self.admin_cert), str(self.admin_key))

        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if self._apiserver.poll() is not None:
                self._fail(
                    f"kube-apiserver exited with code {self._apiserver.returncode}",
                    self.apiserver_log,
                )
            try:
                status, body = self.get_raw("/readyz")
                if status == 200 and body.strip() == "ok":
                    break
                last = f"/readyz {status}: {body.strip()[-300:]}"
            except OSError as e:
                last = str(e)
            time.sleep(0.5)
        else:
            self._fail(
                f"kube-apiserver not ready after {self.start_timeout:.0f}s ({last})",
                self.apiserver_log,
            )
        _, body = self.get_raw("/version")
        self.version = json.loads(body)["gitVersion"]
        self._write_kubeconfig()

    # ------------------------------------------------------------ components
    def log_path(self, component: str) -> Path:
        return self.work_dir / f"{component}.log"

    def _component_kubeconfig(self, component: str, user: str,
                              group: str | None = None) -> Path:
        cert, key = self.issue_client_cert(component, user, group)
        return self._write_kubeconfig(self.work_dir / f"{component}.kubeconfig", user,
                                      cert, key)

    def _serving_args(self, component: str, user: str, port: int) -> list[str]:
        """The flags kube-scheduler and kube-controller-manager share: their identity
        towards the API server, their own HTTPS endpoint, and no leader election (one
        of each runs)."""
        kc = self._component_kubeconfig(component, user)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self.work_dir / (component + '-certs')}",
            "--leader-elect=false",
        ]

    def _start_components(self) -> None:
        for name in self.components:
            port = self.component_ports[name] = free_port()
            if name == SCHEDULER:
                args = self._serving_args(name, "system:kube-scheduler", port)
            elif name == CONTROLLER_MANAGER:
                args = [
                    *self._serving_args(name, "system:kube-controller-manager", port),
                    f"--service-account-private-key-file={self.sa_key}",
                    f"--root-ca-file={self.ca_cert}",
                    f"--cluster-signing-cert-file={self.ca_cert}",
                    f"--cluster-signing-key-file={self.ca_key}",
                    "--use-service-account-credentials=true",
                    "--cluster-name=gpu-sim",
                    # The default set: ReplicaSet, Deployment, Job, namespace, garbage
                    # collector, node lifecycle, resourceclaim (DRA), ...
                    "--controllers=*",
                ]
            else:  # kwok
                args = [
                    f"--kubeconfig={self.kubeconfig}",
                    f"--config={self.kwok_config}",
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector="
                    f"{KWOK_NODE_ANNOTATION[0]}={KWOK_NODE_ANNOTATION[1]}",
                    # Leases, renewed by kwok, are how the node lifecycle controller
                    # knows a node is alive (as kwokctl runs it).
                    "--node-lease-duration-seconds=40",
                    # Pod IPs from a range nothing on this machine routes.
                    "--cidr=10.244.0.0/16",
                    f"--node-ip={LOOPBACK}",
                    f"--server-address={LOOPBACK}:{port}",
                ]
            argv = [str(self.bin_dir / name), *args, *self.component_args.get(name, [])]
            self._procs[name] = self._spawn(argv, self.log_path(name))
        for name in self.components:
            self._wait_healthy(name)

    def _wait_healthy(self, name: str) -> None:
        """Poll the component's /healthz (kwok serves plain HTTP, the others HTTPS with a
        self-signed certificate, so the address, not the certificate, is what is trusted)."""
        port = self.component_ports[name]
        scheme = "http" if name == KWOK else "https"
        url = f"{scheme}://{LOOPBACK}:{port}/healthz"
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        proc = self._procs[name]
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._fail(f"{name} exited with code {proc.returncode}", self.log_path(name))
            try:
                ctx = insecure if scheme == "https" else None
                with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
                    last = f"{r.status}"
            except urllib.error.HTTPError as e:
                last = f"{e.code}: {e.read().decode(errors='replace')[-300:]}"
            except OSError as e:
                last = str(e)
            time.sleep(0.3)
        self._fail(f"{name} not healthy after {self.start_timeout:.0f}s ({last})",
                   self.log_path(name))

    def check_components(self) -> None:
        """Raise if a started component has exited (a test then fails with its log)."""
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                self._fail(f"{name} exited with code {proc.returncode}", self.log_path(name))

    def pids(self) -> dict[str, int]:
        """Every running process of this control plane, by name."""
        procs = {"etcd": self._etcd, "kube-apiserver": self._apiserver, **self._procs}
        return {n: p.pid for n, p in procs.items() if p is not None and p.poll() is None}

    def detach(self) -> dict[str, int]:
        """Leave the processes running after this Python process exits (``make demo``):
        nothing stops them at exit any more. Returns their pids (stop them with
        SIGTERM, e.g. ``make demo-down``)."""
        atexit.unregister(self.stop)
        pids = self.pids()
        self._procs = {}
        self._apiserver = self._etcd = None
        return pids

    def _fail(self, message: str, log: Path) -> None:
        raise ControlPlaneError(f"{message}\n--- last lines of {log} ---\n{_tail(log)}")

    # ------------------------------------------------------------------ use
    def get_raw(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET ``path`` on the apiserver as admin; returns (status, body)."""
        req = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG and the bin dir first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane as admin."""
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(
                proc.returncode, proc.args, proc.stdout, proc.stderr
            )
        return proc

    # ------------------------------------------------------------------ stop
    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Stop kwok, the scheduler and the controller-manager, then kube-apiserver,
        then etcd (SIGTERM, SIGKILL after a grace period)."""
        for name in reversed(list(self._procs)):
            self._terminate(self._procs[name])
        self._procs = {}
        self._terminate(self._apiserver)
        self._terminate(self._etcd)
        self._apiserver = self._etcd = None
        atexit.unregister(self.stop)

    def cleanup(self) -> None:
        """stop(), and remove the work dir if this object created it."""
        self.stop()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    """Smoke test: start, use with kubectl, stop."""
    if len(argv) > 2 or (argv and argv[0] in ("-h", "--help")):
        print(f"usage: {sys.argv[0]} [BIN_DIR [WORK_DIR]]", file=sys.stderr)
        return 2
    bin_dir = Path(argv[0]) if argv else build_binaries()
    work_dir = argv[1] if len(argv) > 1 else None
    t0 = time.monotonic()
    cp = ControlPlane(bin_dir, work_dir)
    with cp:
        print(f"control plane {cp.version} ready in {time.monotonic() - t0:.1f}s")
        print(f"server:     {cp.server}")
        print(f"kubeconfig: {cp.kubeconfig}")
        for args in (
            ["version"],
            ["create", "namespace", "x"],
            ["get", "ns"],
            ["auth", "can-i", "create", "mutatingwebhookconfigurations"],
        ):
            print(f"$ kubectl {' '.join(args)}")
            print(cp.kubectl(*args).stdout.rstrip())
    print("stopped")
    if cp._own_work_dir:
        cp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
