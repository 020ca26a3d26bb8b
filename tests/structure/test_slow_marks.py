"""`slow` means slow: a test that requests a fixture declared `@real_checkpoint` (tests/real_checkpoints.py: it loads
the joe voice or another real checkpoint, or builds a real-size model), directly or through another fixture, is
marked `slow`, so `make test` runs it in the one slow group and `make test-quick` (`-m "not slow"`) leaves it out.
The suite is collected by pytest itself, in a child process, and each test's fixture closure read from there.
A fixture fetched by name at run time (`request.getfixturevalue`) is not in the closure: this check cannot see it."""
from __future__ import annotations

import json
import subprocess
import sys

from rkaudio.core.paths import REPO_ROOT

COLLECT = """
import json, sys
import pytest
from tests.real_checkpoints import loads_a_real_checkpoint

class Requests:
    rows = []

    def pytest_collection_finish(self, session):
        for item in session.items:
            info = getattr(item, "_fixtureinfo", None)
            declared = sorted(name for name, defs in (info.name2fixturedefs.items() if info else ())
                              if loads_a_real_checkpoint(defs[-1].func))
            self.rows.append({"test": item.nodeid, "slow": item.get_closest_marker("slow") is not None,
                              "real": declared})

code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"], plugins=[Requests()])
with open(sys.argv[1], "w") as out:
    json.dump(Requests.rows, out)
sys.exit(code)
"""


def test_every_test_of_a_real_checkpoint_fixture_is_marked_slow(tmp_path):
    found = tmp_path / "requests.json"
    run = subprocess.run([sys.executable, "-c", COLLECT, str(found)], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(found.read_text())
    real = [row for row in rows if row["real"]]
    # the declaration reaches the collected tests (the joe voice's are the known ones)
    assert any("joe" in row["real"] for row in real), f"no collected test requests the joe fixture of {len(rows)}"
    unmarked = [f"{row['test']} (requests {', '.join(row['real'])})" for row in real if not row["slow"]]
    assert not unmarked, ("these tests load a real checkpoint but are not marked `slow` (add @pytest.mark.slow or "
                          "the module's `pytestmark = pytest.mark.slow`):\n" + "\n".join(unmarked))
