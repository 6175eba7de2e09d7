"""`up --dry-run` needs nothing: no credentials, no network (every endpoint and the "what is
my IP" service point at a closed loopback port), and still prints the plan and its price."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Shell

pytestmark = pytest.mark.integration

CASES = {
    # provider: (flags, instance type, price, in the requests: a placeholder, the caller's)
    "aws": (["--gpus", "A100:8"], "p4d.24xlarge", "$65.55/h", "Deep Learning Base AMI", False),
    "gcp": (["--gpus", "A100:8"], "a2-highgpu-8g", "/h", "a2-highgpu-8g", True),
    "azure": (["--gpus", "A100:8"], "Standard_ND96asr_v4", "/h", "Standard_ND96asr_v4", True),
}


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Shell:
    """No credentials anywhere: the test tier's fake AWS keys removed, each SDK's config
    pointed at nothing (the endpoints already point at a closed port)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "azure"))
    monkeypatch.setenv("CLOUDTRAIN_AZURE_ENDPOINT", "https://127.0.0.1:9")
    return Shell(tmp_path / "home")


@pytest.mark.parametrize("provider", sorted(CASES))
def test_a_dry_run_without_credentials_or_network_prints_the_plan(
    offline: Shell, provider: str
) -> None:
    flags, instance_type, price, request, shows_cidr = CASES[provider]
    done = offline("up", "--provider", provider, *flags, "--nodes", "2", "--name", "p1",
                   "--dry-run", timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert instance_type in done.stdout
    assert price in done.stdout
    assert request in done.stdout, "the request is shown, with placeholders"
    assert ("<your public address>/32" in done.stdout) == shows_cidr  # AWS: in its SG's rule
    assert "not asked of the cloud (placeholders above):" in done.stdout
    assert "your public address" in done.stdout.split("not asked of the cloud")[1]
    assert "nothing was created" in done.stdout
    assert offline.status()["clusters"] == [], "a dry run records nothing"
