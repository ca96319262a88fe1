"""The long fuzzing campaign, outside CI: the same properties as ``test_fuzz.py`` with
``FUZZ_EXAMPLES`` examples (default 100,000 generated reviews; the quota state machine
runs a quarter as many sequences of 40 steps). Prints hypothesis' statistics: how many
examples passed and what they exercised.

    .venv/bin/python tests/fuzz/run_long.py [EXAMPLES]

On two cores 100,000 reviews take roughly 10-20 minutes; run it in the background.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    examples = sys.argv[1] if len(sys.argv) > 1 else "100000"
    env = {**os.environ, "FUZZ_EXAMPLES": examples}
    return subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--hypothesis-show-statistics", "--hypothesis-seed", os.environ.get("FUZZ_SEED", "0"),
         str(HERE / "test_fuzz.py")],
        env=env, cwd=HERE.parents[1])


if __name__ == "__main__":
    sys.exit(main())
