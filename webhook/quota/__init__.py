"""GPU quotas: usage accounting (``usage``), the pure quota check (``check``), the
in-process store (``memory``), the watch-fed pod cache (``cache``) and the shared
ledger that makes admissions atomic across webhook replicas (``ledger``)."""
