"""`elastic._preload`: a fork waits for the preload, so a child never sees a module half
imported; a module that fails to import is left for the worker; and what the agent preloads
touches no GPU (forking after CUDA's initialisation would break the workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def python(code: str, cwd: Path) -> str:
    """`code`'s output; it must exit 0 and write nothing on stderr (a fork hook's error is
    only printed, as "Exception ignored in…")."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def test_a_fork_waits_for_the_whole_preload_and_a_broken_module_is_skipped(
    tmp_path: Path,
) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('broken at import')\n")
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(0.5)\nDONE = True\n")
    out = python(
        """
        import os, sys
        sys.path.insert(0, os.getcwd())
        from cloudtrain.jobs import elastic
        elastic._preload(["broken", "slow"])
        pid = os.fork()  # at once: the preload is still asleep in slow's import
        if pid == 0:
            print("child sees", sys.modules["slow"].DONE, "broken" in sys.modules, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        tmp_path,
    )
    assert out.strip() == "child sees True False"


def test_the_preload_touches_no_gpu(tmp_path: Path) -> None:
    """Every torch.cuda call that could start the driver is watched while PRELOAD imports."""
    out = python(
        """
        import torch
        from torch import cuda
        calls = []
        for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
                     "get_device_properties", "get_device_capability", "synchronize",
                     "mem_get_info", "set_device", "is_bf16_supported"):
            real = getattr(cuda, name)
            setattr(cuda, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
        from cloudtrain.jobs import elastic
        for module in elastic.PRELOAD:
            __import__(module)
        print("calls", calls, cuda.is_initialized())
        """,
        tmp_path,
    )
    assert out.strip() == "calls [] False"


def test_a_fork_made_by_the_preload_itself_does_not_wait_for_itself(tmp_path: Path) -> None:
    (tmp_path / "forks.py").write_text(
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nDONE = 1\n"
    )
    out = python(
        """
        import os, sys
        sys.path.insert(0, os.getcwd())
        from cloudtrain.jobs import elastic
        elastic._preload(["forks"])
        pid = os.fork()
        if pid == 0:
            print("child sees", sys.modules["forks"].DONE, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        tmp_path,
    )
    assert out.strip() == "child sees 1"


def test_the_agent_asks_cuda_only_through_nvml_and_the_worker_gets_the_jobs_value(
    tmp_path: Path,
) -> None:
    """torch's own LaunchConfig asks ``torch.cuda.is_available()``, which (by the CUDA runtime's
    device count) spoils every fork on a GPU node: seen on an H200 as "Cannot re-initialize
    CUDA in forked subprocess" in every fork job. The agent's asks go through NVML; the worker
    sees the job's own value of the switch again (unset here; a set value: the next test)."""
    (tmp_path / "worker.py").write_text(
        "import os\nprint('worker sees', os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))\n"
    )
    out = python(
        """
        import os
        from torch import cuda
        agent, asked = os.getpid(), []
        real = cuda.is_available
        def watched():
            if os.getpid() == agent:
                asked.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
            return real()
        cuda.is_available = watched
        from cloudtrain.jobs import elastic
        elastic.main(["--standalone", "--nproc-per-node", "1", "--start-method", "fork",
                      "worker.py"])
        print("agent asked", asked, flush=True)
        """,
        tmp_path,
    )
    assert "worker sees None" in out
    assert "agent asked ['1']" in out or "agent asked ['1', '1']" in out, out


def test_a_worker_gets_back_the_jobs_own_nvml_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.jobs import elastic

    monkeypatch.setenv(elastic.NVML_CHECK, "0")
    elastic._fork_safe_cuda_checks()
    assert os.environ[elastic.NVML_CHECK] == "1"
    elastic._restore_nvml_check()
    assert os.environ[elastic.NVML_CHECK] == "0"
