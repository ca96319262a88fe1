"""``PolicySource`` in process: what a reader of (policy, last error) can see.

``/readyz`` reads the active policy, then the last reload error. The flake this pins
down: a good edit published generation 2 before it cleared the bad edit's error, so a
reader in between saw generation 2 *and* the old error. A later file version must win,
and the error must be gone by the time its generation is visible.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from webhook.policy.load import default_policy_text
from webhook.server.sources.reload import PolicySource

GOOD = default_policy_text()


def _write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    # A distinct mtime per version, as a ConfigMap's symlink swap gives a new inode.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


def test_a_good_edit_clears_the_error_before_its_generation_is_seen(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, GOOD, 0)
    source = PolicySource(str(path))
    source.load()
    _write(path, "apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n", 1)
    assert not source.reload_if_changed()
    assert source.last_error

    seen: list[str | None] = []
    install = source._install

    def publishing(*args: object) -> object:
        out = install(*args)  # type: ignore[arg-type]
        seen.append(source.last_error)  # what a reader sees with the new generation
        return out

    monkeypatch.setattr(source, "_install", publishing)
    _write(path, GOOD.replace("name: shared-gpu-cluster", "name: renamed"), 2)
    assert source.reload_if_changed()
    assert source.active is not None and source.active.generation == 2
    assert seen == [None]


def test_a_file_changed_while_it_was_read_is_read_again(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, GOOD, 0)
    source = PolicySource(str(path))
    source.load()
    _write(path, GOOD.replace("name: shared-gpu-cluster", "name: second"), 1)
    import webhook.server.sources.reload as reload

    real = reload.load_file

    def read_then_edited(p: str) -> object:
        out = real(p)
        _write(path, GOOD.replace("name: shared-gpu-cluster", "name: third"), 2)
        return out

    monkeypatch.setattr(reload, "load_file", read_then_edited)
    assert source.reload_if_changed()
    monkeypatch.setattr(reload, "load_file", real)
    assert source.reload_if_changed()  # the version written during the read wins
    assert source.active is not None and source.active.policy.name == "third"
    assert not source.reload_if_changed()
