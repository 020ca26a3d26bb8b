"""The converter children (`python -m rkaudio.toolkit.child`) this test process started and has not closed."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def converter_children(stdout: Optional[Path] = None) -> list[int]:
    """Pids of this process's living converter children; with `stdout`, only the ones whose fd 1 is that file
    (the build log of one ConverterChild)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
            fd_1 = os.readlink(entry / "fd" / "1") if stdout is not None else None
        except (OSError, IndexError, ValueError):  # gone while we looked
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid != os.getpid() or b"rkaudio.toolkit.child" not in cmdline or state == "Z":
            continue
        if stdout is None or fd_1 == str(Path(stdout).resolve()):
            pids.append(int(entry.name))
    return pids
