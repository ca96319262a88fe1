"""GPU quotas: usage accounting (``usage``), the pure quota arithmetic (``check``,
``cohort``), the store interface and its in-memory store (``store``), the watch-fed pod
and claim caches (``cache``, ``claims``), the shared ledger that makes admissions atomic
across webhook replicas (``ledger``, its ConfigMaps' format in ``entries``), gang
reservations (``gang``), borrowing in a cohort (``borrow``) and quota as people read it
(``status``)."""
