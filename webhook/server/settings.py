"""Server settings: every flag of ``gpu-webhook serve``, with its environment variable.

Flags win over environment variables (``GPU_WEBHOOK_<NAME>``), which win over the
defaults. With no flags at all the server runs on a laptop: dev certificates under
``certs/``, the embedded example policy, no cluster.

Every value is checked here, before anything starts, and a bad one ends ``serve`` with
one line naming the flag, the value and what it may be (``SystemExit`` with that text):
never a traceback from deep inside uvicorn or logging. There is no ``--workers``: one
process per replica is the design (quota reservations of one process queue on one
lock; scale by replicas, each with its own watch cache).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, fields

LOG_LEVELS = ("debug", "info", "warning", "error")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class Settings:
    host: str = "0.0.0.0"
    port: int = 8443
    cert_dir: str = "certs"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_min_version: str = "1.2"
    client_ca: str | None = None
    client_cn: str | None = None
    cert_poll_seconds: float = 2.0
    policy: str | None = None
    policy_poll_seconds: float = 2.0
    policy_object: str | None = None
    policy_report_seconds: float = 300.0
    log_level: str = "info"
    kubeconfig: str | None = None
    namespace: str | None = None
    max_inflight: int = 256
    max_connections: int = 1024
    request_timeout: float = 8.0
    self_managed_certs: bool = False
    cert_secret: str = "gpu-webhook-tls"
    service: str = "gpu-webhook"
    webhook_configurations: str = "mutating=gpu-webhook,validating=gpu-webhook"
    webhook_configurations_sync: str = "report"
    cert_hosts: str | None = None
    cert_validity_hours: float = 2160.0
    ca_validity_hours: float = 87600.0
    cert_check_seconds: float = 3600.0
    quota_status_seconds: float = 10.0
    audit_seconds: float = 300.0
    release_seconds: float = 1.0
    quota_commit: str = "ledger"
    leader_url: str | None = None
    leader_ca_file: str | None = None
    leader_server_name: str | None = None
    test_clock_offset_file: str | None = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        for f in fields(Settings):
            flag = "--" + f.name.replace("_", "-")
            env = "GPU_WEBHOOK_" + f.name.upper()
            if isinstance(f.default, bool):  # a switch: --flag, or the env var set to true
                parser.add_argument(flag, dest=f.name, action="store_true", default=None,
                                    help=f"{_doc(f.name)} [env {env}=true]")
                continue
            kind = {int: int, float: float}.get(type(f.default), str)
            parser.add_argument(flag, dest=f.name, type=kind, default=None,
                                choices=LOG_LEVELS if f.name == "log_level" else None,
                                help=f"{_doc(f.name)} [env {env}; default {f.default}]")

    @staticmethod
    def from_args(args: argparse.Namespace) -> Settings:
        """The settings of a parsed command line: each flag, else its environment
        variable, else the default; every value checked alone, then together."""
        values: dict[str, object] = {}
        for f in fields(Settings):
            v = getattr(args, f.name, None)
            if v is None:
                v = _from_env(f.name, f.default)
            if v is not None:
                values[f.name] = v
        s = Settings(**values)  # type: ignore[arg-type]
        s._check_values()
        s._check_serving()
        if s.policy_object is not None:
            s._check_policy_object(s.policy_object)
        if s.self_managed_certs:
            s._check_self_managed()
        if s.quota_commit == "leader":
            s._check_leader()
        return s

    def _check_serving(self) -> None:
        """TLS, connections and deadlines."""
        if self.tls_min_version not in ("1.2", "1.3"):
            raise SystemExit(f"--tls-min-version must be 1.2 or 1.3, not "
                             f"{self.tls_min_version!r}")
        if self.max_connections < 1:
            raise SystemExit(f"--max-connections must be at least 1, not "
                             f"{self.max_connections}")
        if self.max_inflight < 1:
            raise SystemExit(f"--max-inflight must be at least 1, not {self.max_inflight}")
        if not 0 < self.request_timeout <= 30:
            raise SystemExit(f"--request-timeout must be more than 0 and at most 30 seconds "
                             f"(the API server's limit), not {self.request_timeout}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SystemExit("--tls-cert and --tls-key go together: give both or neither")
        if self.client_cn is not None and not self.client_ca:
            raise SystemExit("--client-cn needs --client-ca: without a CA to verify client "
                             "certificates there is no common name to check")
        if self.client_cn is not None and not self.client_cn_list():
            raise SystemExit("--client-cn is empty: give one or more names, comma-separated")

    def _check_policy_object(self, name: str) -> None:
        if self.policy is not None:
            raise SystemExit("--policy and --policy-object are two sources of the policy: "
                             "give one (--policy FILE, or --policy-object NAME of a "
                             "GPUPolicy)")
        if not _DNS_SUBDOMAIN.fullmatch(name):
            raise SystemExit(f"--policy-object {name!r} is not a GPUPolicy name "
                             "(lowercase letters, digits, '-' and '.')")
        if not self.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise SystemExit("--policy-object reads the GPUPolicy from the cluster: give "
                             "--kubeconfig (or run in a pod)")

    def _check_leader(self) -> None:
        if not self.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise SystemExit("--quota-commit leader elects its leader in the cluster: give "
                             "--kubeconfig (or run in a pod)")
        if not (self.leader_url or "https://").startswith("https://"):
            raise SystemExit(f"--leader-url {self.leader_url!r} must be an https:// URL")
        if not self.advertised():
            raise SystemExit("--quota-commit leader: the other replicas cannot reach this one "
                             f"at --host {self.host}; give --leader-url https://ADDRESS:PORT "
                             "(or set POD_IP)")
        if self.leader_ca() is None:
            raise SystemExit("--quota-commit leader checks the leader's certificate: give "
                             "--leader-ca-file (no ca.crt or ca.pem in --cert-dir)")

    def advertised(self) -> str:
        """Where this replica answers the others (--leader-url, or its default)."""
        if self.leader_url:
            return self.leader_url.rstrip("/")
        if os.environ.get("POD_IP"):
            return f"https://{os.environ['POD_IP']}:{self.port}"
        if self.host not in ("0.0.0.0", "::", ""):
            return f"https://{self.host}:{self.port}"
        return ""

    def leader_ca(self) -> str | None:
        """The CA the leader's certificate is checked against (see --leader-ca-file)."""
        if self.leader_ca_file:
            return self.leader_ca_file
        written = self.written_ca()
        if written is not None:
            return written
        for name in ("ca.crt", "ca.pem"):
            if os.path.isfile(os.path.join(self.cert_dir, name)):
                return os.path.join(self.cert_dir, name)
        return None

    def written_ca(self) -> str | None:
        """Where the self-managed sync writes the certificate Secret's CA bundle for the
        leader's relay (before serving, and at every sync): with --self-managed-certs and
        --quota-commit leader, unless --leader-ca-file names a CA of its own (never
        written over)."""
        if self.self_managed_certs and self.quota_commit == "leader" and not self.leader_ca_file:
            return os.path.join(self.cert_dir, "ca.crt")
        return None

    def leader_name(self, namespace: str) -> str | None:
        """The name the leader's certificate must hold (None: the URL's host)."""
        if self.leader_server_name:
            return self.leader_server_name
        if os.environ.get("POD_IP") and not self.leader_url:
            return f"{self.service}.{namespace}.svc"
        return None

    def _check_self_managed(self) -> None:
        self.certificate_targets()  # named errors for a bad value
        if not self.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise SystemExit("--self-managed-certs keeps the certificate in a Secret: "
                             "give --kubeconfig (or run in a pod)")
        if self.cert_validity_hours < 0.01:
            raise SystemExit(f"--cert-validity-hours must be at least 0.01, not "
                             f"{self.cert_validity_hours}")
        if self.ca_validity_hours < 3 * self.cert_validity_hours:
            raise SystemExit(
                f"--ca-validity-hours ({self.ca_validity_hours:g}) must be at least 3 times "
                f"--cert-validity-hours ({self.cert_validity_hours:g}): the CA is renewed "
                "when a third of its life is left, and should outlive the serving "
                "certificates it signs")
        if self.cert_check_seconds <= 0:
            raise SystemExit(f"--cert-check-seconds must be more than 0, not "
                             f"{self.cert_check_seconds}")

    def _check_values(self) -> None:
        """Range and shape of each value on its own (flag or environment variable alike)."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise SystemExit(f"--{_flag(f.name)} must be a finite number, not {v}")
        if self.log_level not in LOG_LEVELS:
            raise SystemExit(f"--log-level must be one of {', '.join(LOG_LEVELS)}, "
                             f"not {self.log_level!r}")
        if self.webhook_configurations_sync not in ("fix", "report", "off"):
            raise SystemExit(f"--webhook-configurations-sync must be fix, report or off, not "
                             f"{self.webhook_configurations_sync!r}")
        if self.quota_commit not in ("ledger", "leader"):
            raise SystemExit(f"--quota-commit must be ledger or leader, not "
                             f"{self.quota_commit!r}")
        if not 0 <= self.port <= 65535:
            raise SystemExit(f"--port must be 0-65535, not {self.port}")
        for name in ("quota_status_seconds", "audit_seconds", "release_seconds"):
            if getattr(self, name) < 0:
                raise SystemExit(f"--{_flag(name)} must be 0 (off) or more seconds, not "
                                 f"{getattr(self, name)}")
        for name in ("cert_poll_seconds", "policy_poll_seconds", "policy_report_seconds"):
            if getattr(self, name) <= 0:
                raise SystemExit(f"--{_flag(name)} must be more than 0 seconds, not "
                                 f"{getattr(self, name)}")
        if not self.host.strip():
            raise SystemExit("--host is empty: give an address, e.g. 0.0.0.0 or 127.0.0.1")
        if self.namespace is not None and not _DNS_LABEL.fullmatch(self.namespace):
            raise SystemExit(f"--namespace {self.namespace!r} is not a namespace name "
                             "(lowercase letters, digits and '-', at most 63)")
        for name in ("service", "cert_secret"):
            value = getattr(self, name)
            pattern = _DNS_LABEL if name == "service" else _DNS_SUBDOMAIN
            if not pattern.fullmatch(value):
                raise SystemExit(f"--{_flag(name)} {value!r} is not a valid object name "
                                 "(lowercase letters, digits and '-')")
        if self.leader_server_name == "":
            raise SystemExit("--leader-server-name is empty: give a DNS name, or leave it out")
        for name in ("cert_dir", "tls_cert", "tls_key", "client_ca", "policy", "kubeconfig",
                     "test_clock_offset_file", "leader_ca_file"):
            if getattr(self, name) == "":
                raise SystemExit(f"--{_flag(name)} is empty: give a path, or leave it out")

    def certificate_targets(self) -> dict[str, str]:
        """--webhook-configurations as {"mutating": NAME, "validating": NAME}."""
        targets: dict[str, str] = {}
        for item in (i.strip() for i in self.webhook_configurations.split(",")):
            if not item:
                continue
            kind, _, name = item.partition("=")
            kind, name = kind.strip(), name.strip()
            if kind not in ("mutating", "validating") or not name or kind in targets:
                raise SystemExit(
                    f"--webhook-configurations: {item!r} is not KIND=NAME with KIND mutating "
                    "or validating (each once), e.g. mutating=gpu-webhook,validating=gpu-webhook")
            targets[kind] = name
        if not targets:
            raise SystemExit("--webhook-configurations is empty: give "
                             "mutating=NAME,validating=NAME")
        return targets

    def cert_host_list(self) -> list[str]:
        """--cert-hosts as a list of extra DNS names and IP addresses."""
        return [h.strip() for h in (self.cert_hosts or "").split(",") if h.strip()]

    def client_cn_list(self) -> list[str]:
        """The allowed client certificate common names (empty: any the CA signed)."""
        return [n.strip() for n in (self.client_cn or "").split(",") if n.strip()]


_DOCS = {
    "host": "Address to listen on.",
    "port": "HTTPS port.",
    "cert_dir": "Directory with tls.crt and tls.key; dev certificates are generated there "
                "if both are missing.",
    "tls_cert": "Serving certificate file (overrides --cert-dir).",
    "tls_key": "Private key of the serving certificate.",
    "tls_min_version": "Lowest TLS version accepted: 1.2 or 1.3.",
    "client_ca": "CA for client certificates; when set, every path but /healthz and /readyz "
                 "answers 403 to a caller without a certificate it signed (mTLS).",
    "client_cn": "Comma-separated common names a client certificate must carry, e.g. "
                 "kube-apiserver (needs --client-ca; default: any name the CA signed).",
    "cert_poll_seconds": "How often tls.crt/tls.key are checked for a new certificate.",
    "policy": "Policy file (the embedded example policy when unset).",
    "policy_poll_seconds": "How often the policy file is checked for changes.",
    "policy_object": "Serve the GPUPolicy object of this name (cluster-scoped), watched and "
                     "reloaded on each change, instead of a --policy file; a refused edit "
                     "keeps the last accepted generation (deploy/README.md, GPUPolicy objects).",
    "policy_report_seconds": "With --policy-object: how often a replica refreshes its entry "
                             "in the GPUPolicy's status.replicas (an entry three periods old "
                             "is dropped).",
    "log_level": "debug, info, warning or error.",
    "kubeconfig": "kubeconfig of the cluster whose pods count against quota (in a pod, the "
                  "service account is used; with neither, usage is kept in memory).",
    "max_inflight": "Admission requests handled at once; beyond it a request is answered "
                    "429 at once, and the webhook's failurePolicy applies.",
    "max_connections": "Connections open at once (in TLS handshake or after); beyond it a "
                       "new connection is closed at once. Each costs up to ~50 KB.",
    "request_timeout": "Seconds a review may take from its first byte to its answer (also "
                       "cut to 80%% of the API server's ?timeout=); a review that waited "
                       "longer gets 503 instead of an answer the API server stopped "
                       "waiting for.",
    "namespace": "Namespace of the quota ledger objects and of the --cert-secret (default: "
                 "the pod's own namespace).",
    "self_managed_certs": "Issue and renew the serving certificate in the --cert-secret "
                          "Secret (a CA kept in it), serve it from --cert-dir (or "
                          "--tls-cert/--tls-key) and patch the CA into the caBundle of the "
                          "--webhook-configurations; for clusters without cert-manager. "
                          "Needs a cluster (--kubeconfig or in a pod).",
    "cert_secret": "Secret (in --namespace) holding ca.crt, ca.key, tls.crt and tls.key, with "
                   "--self-managed-certs.",
    "service": "Service name the API server calls; the serving certificate is for its DNS "
               "names in --namespace (with --self-managed-certs).",
    "webhook_configurations": "mutating=NAME,validating=NAME: the webhook configurations "
                              "whose caBundle --self-managed-certs keeps in step, and "
                              "which the leader compares with the policy.",
    "webhook_configurations_sync": "With a cluster, on the leader: fix (write the "
                                   "--webhook-configurations as the served policy needs "
                                   "them, and report what differed), report (only report: "
                                   "metric, Event, /readyz, `gpu-webhook status`) or off. "
                                   "The Helm chart and deploy/base set fix.",
    "cert_hosts": "Extra DNS names and IP addresses for the self-managed serving certificate, "
                  "comma-separated (a webhook called by URL).",
    "cert_validity_hours": "Validity of the self-managed serving certificate (renewed with a "
                           "third left: 30 days before expiry by default); fractions allowed.",
    "ca_validity_hours": "Validity of the self-managed CA (rolled over with a third left); at "
                         "least 3 times --cert-validity-hours.",
    "cert_check_seconds": "With --self-managed-certs: longest time between two reads of the "
                          "Secret (renewals due sooner are done when due).",
    "quota_status_seconds": "With a cluster: how often the leader replica brings the GPUQuota "
                            "objects (kubectl get gpuquotas) up to date; 0: not written.",
    "audit_seconds": "With a cluster: how often the leader replica audits the running GPU "
                     "pods and workloads and writes PolicyReports (wgpolicyk8s.io); 0: no "
                     "periodic audit.",
    "release_seconds": "With a cluster: how often the leader replica releases the pods "
                       "waiting for quota (tenants' overQuota: wait) that fit; 0: none is "
                       "released.",
    "quota_commit": "With a cluster: ledger (every replica decides GPU quota, each admission "
                    "a conditional write of its tenant's ledger ConfigMap) or leader (the "
                    "leader replica decides it in memory, the others relay their reviews "
                    "to it; after a leader change no GPU pod is admitted for the hand-over, "
                    "the reservation TTL and a few seconds: docs/quota.md).",
    "leader_url": "With --quota-commit leader: where this replica answers the others, "
                  "written in the leader Lease (default https://$POD_IP:--port, or "
                  "https://--host:--port when --host is one address).",
    "leader_ca_file": "With --quota-commit leader: the CA the leader's serving certificate "
                      "is checked against (default ca.crt, else ca.pem, in --cert-dir; "
                      "with --self-managed-certs, the certificate Secret's ca.crt, "
                      "written there).",
    "leader_server_name": "With --quota-commit leader: the name the leader's certificate "
                          "is checked for (default the Service's, "
                          "--service.--namespace.svc, in a pod; else the --leader-url's "
                          "host).",
    "test_clock_offset_file": "For tests only: a file holding seconds added to the clock "
                              "that quota windows (quotaSchedule) are decided by, re-read "
                              "when it changes. Never set where quota is enforced.",
}

_BOOLS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False, "": False}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _doc(name: str) -> str:
    return _DOCS.get(name, "")


def _from_env(name: str, default: object) -> object:
    """A setting's ``GPU_WEBHOOK_<NAME>`` environment variable, typed as its default (None
    when unset); a value of the wrong type ends ``serve`` naming the variable."""
    env = os.environ.get("GPU_WEBHOOK_" + name.upper())
    if env is None:
        return None
    if isinstance(default, bool):
        if env.lower() not in _BOOLS:
            raise SystemExit(f"GPU_WEBHOOK_{name.upper()}={env!r} is not a "
                             "boolean (true or false)")
        return _BOOLS[env.lower()]
    kind = {int: int, float: float}.get(type(default), str)
    try:
        return kind(env)
    except ValueError:
        raise SystemExit(f"GPU_WEBHOOK_{name.upper()}={env!r} is not a "
                         f"valid {kind.__name__}") from None
