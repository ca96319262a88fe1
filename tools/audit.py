"""Dependency audit for ``make audit``: pip-audit over the installed environment.

pip-audit asks a vulnerability service (PyPI's JSON API, or OSV) about every installed
package. Where that service is unreachable, pip-audit still prints "No known
vulnerabilities found" while it skipped every package; that is not a pass. So: a
vulnerability fails the target; an audit that could check nothing is reported as
SKIPPED, loudly, with the reason, and does not fail the build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def main() -> int:
    done = subprocess.run(
        [str(BIN / "pip-audit"), "--local", "--format", "json", "--progress-spinner", "off"],
        capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"audit: SKIPPED, pip-audit could not reach its vulnerability service: {last}")
        return 0
    deps = report.get("dependencies", [])
    skipped = [d for d in deps if d.get("skip_reason")]
    audited = [d for d in deps if not d.get("skip_reason")]
    vulnerable = [d for d in audited if d.get("vulns")]
    for d in vulnerable:
        for v in d["vulns"]:
            fixes = ", ".join(v.get("fix_versions") or []) or "no fix yet"
            print(f"audit: {d['name']} {d['version']}: {v['id']} (fixed in {fixes})")
    if vulnerable:
        return 1
    if not audited:
        reason = skipped[0]["skip_reason"] if skipped else "nothing installed"
        print(f"audit: SKIPPED, no package could be checked ({len(skipped)} skipped; "
              f"e.g. {reason}). The vulnerability service is unreachable from here; "
              "run `make audit` where PyPI's JSON API or osv.dev is reachable.")
        return 0
    print(f"audit: {len(audited)} packages checked, no known vulnerabilities"
          + (f" ({len(skipped)} not on PyPI, skipped)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
