"""Every ``python`` block of docs/PYTHON.md runs: the quick start as a process (a message
handled, SIGTERM exits 0), the producer block as a process, the others in order in one
namespace against the stack."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List

import rsc
from conftest import REPO, Stack, wait_for


def blocks() -> List[str]:
    text = (REPO / "docs" / "PYTHON.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_every_python_block_of_the_guide_runs(stack: Stack) -> None:
    quick, produce, *rest = blocks()
    for group in ["billing", "audit", "shipping", "ledger", "warehouse", "search"]:
        stack.create_group(group, "orders", 2)
    env = stack.env()
    env["POD_IP"] = "127.0.0.9"
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "quickstart.py")
        with open(script, "w") as f:
            f.write(quick)
        pod = subprocess.Popen([sys.executable, script], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
        lines: List[str] = []

        def read() -> None:
            assert pod.stdout is not None
            lines.extend(pod.stdout)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            out = subprocess.run([sys.executable, "-c", produce], env=env, capture_output=True,
                                 text=True, timeout=30, check=True)
            assert out.stdout.startswith("written to shard")
            wait_for("the quick start handles order 7", 30,
                     lambda: any(line.startswith("order 7 from shard") for line in lines) or None)
            pod.send_signal(signal.SIGTERM)
            assert pod.wait(30) == 0
        finally:
            pod.kill()
            pod.wait()
    namespace: Dict[str, Any] = {"rsc": rsc, "COORDINATOR": stack.coordinator.url,
                                 "REDIS": stack.redis.url}
    for block in rest:
        exec(compile(block, "docs/PYTHON.md", "exec"), namespace)
    assert len(namespace["app"].member_ids()) == 7
