"""The names of the files of a package that the board reads, and their digest: the self-test kit's folder, the
sums file, the manifest beside every engine. The packaging side (`rkaudio.release`) writes them under the same
names. Shipped in the self-test kit: the stdlib only, Python 3.8 syntax."""
from __future__ import annotations

import hashlib
from pathlib import Path

KIT_DIR = "selftest"  # the board self-test kit's golden I/O, beside the engines
SUMS_NAME = "SHA256SUMS"  # every file of a package, `sha256sum -c` format
MANIFEST_SUFFIX = ".manifest.json"  # <stem>.manifest.json beside <stem>.rknn


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
