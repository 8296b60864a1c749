"""A real ext4 for the cache's tests: a loop image mounted in a mount namespace of its own.

ext4 hands a freed inode number to the next new file at once, which is how a compaction's new
file came to carry the old file's inode and a writer appended inside it (issue 32, D1).
tmpfs and most test machines' /tmp do not behave so, so the tests that guard against it run
on ext4 where the machine allows a loop mount (root, unshare, mkfs.ext4), and are skipped with
the reason where it does not.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_on_ext4(tmp_path: Path, command: list[str], size_mib: int = 64,
                timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``command`` with the mount point of a fresh ext4 file system appended to it, in
    the repository's root; ``pytest.skip`` with the reason where no ext4 can be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting an ext4 loop image needs root")
    for tool in ("unshare", "mkfs.ext4", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool}: an ext4 loop image cannot be mounted here")
    image = tmp_path / "ext4.img"
    with open(image, "wb") as file:
        file.truncate(size_mib << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()[-200:]}")
    mount_point = tmp_path / "ext4"
    mount_point.mkdir()
    script = (f"mount -o loop {shlex.quote(str(image))} {shlex.quote(str(mount_point))} "
              "|| exit 77; "
              f"exec {shlex.join([*command, str(mount_point)])}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)
    if done.returncode == 77 or "unshare failed" in done.stderr:
        pytest.skip(f"no loop mount allowed here: {done.stderr.strip()[-200:]}")
    return done
