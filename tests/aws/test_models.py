"""botocore's API models kept parsed on disk (`cloudtrain.providers.aws._models`): a second
client reads no JSON, gets the same model, and a cache file that is stale, damaged or of
another Python is a miss that is written over, never an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.loaders import JSONFileLoader

from cloudtrain.providers.aws import _models
from cloudtrain.providers.aws._client import Clients


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The data files botocore parses from JSON from now on (their names)."""
    seen: list[str] = []
    original = JSONFileLoader._load_file

    def load(self: Any, full_path: str, open_method: Any) -> Any:
        found = original(self, full_path, open_method)
        if found is not None:
            seen.append(Path(full_path).name)
        return found

    monkeypatch.setattr(JSONFileLoader, "_load_file", load)
    return seen


def ec2_model(models: Path | None) -> dict[str, Any]:
    """The EC2 model as a new process's first client sees it (a new botocore session)."""
    client = Clients(models=models).ec2("us-east-1")
    raw: dict[str, Any] = client.meta.service_model._service_description
    return raw


def kept(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.marshal"))


def test_a_second_client_parses_no_json_and_gets_the_same_model(
    tmp_path: Path, parsed: list[str]
) -> None:
    plain = ec2_model(None)
    assert "service-2.json.gz" in parsed
    first = ec2_model(tmp_path)
    assert len(kept(tmp_path)) == 2, "EC2's model and the endpoint table"
    parsed.clear()
    second = ec2_model(tmp_path)
    assert not {"service-2.json.gz", "endpoints.json"} & set(parsed), parsed
    assert plain == first == second
    assert list(second["operations"]) == list(plain["operations"]), "in botocore's order"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in kept(tmp_path))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "empty", "other python", "stale"])
def test_a_damaged_or_stale_cache_file_is_a_miss_written_over(
    tmp_path: Path, parsed: list[str], damage: str
) -> None:
    good = ec2_model(tmp_path)
    path = max(kept(tmp_path), key=lambda p: p.stat().st_size)  # EC2's model
    blob = bytearray(path.read_bytes())
    if damage == "flipped byte":
        blob[len(blob) // 2] ^= 0xFF
    elif damage == "truncated":
        del blob[len(blob) // 3 :]
    elif damage == "empty":
        blob.clear()
    elif damage == "other python":
        blob[: len(_models.VERSION)] = _models.VERSION.replace(b"cloudtrain", b"CLOUDTRAIN")
    else:  # the data file changed since (a botocore upgrade in place): its mtime differs
        header = _models._HEADER.unpack_from(blob)
        blob[: _models._HEADER.size] = _models._HEADER.pack(
            header[0], header[1], header[2] - 1, header[3]
        )
    path.write_bytes(bytes(blob))
    parsed.clear()
    assert ec2_model(tmp_path) == good
    assert "service-2.json.gz" in parsed, "the miss read the JSON"
    parsed.clear()
    assert ec2_model(tmp_path) == good
    assert "service-2.json.gz" not in parsed, "and the file was written over"


def test_a_cache_that_cannot_be_written_costs_nothing_but_the_json(
    tmp_path: Path, parsed: list[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert ec2_model(None) == ec2_model(blocked / "models")
    assert parsed.count("service-2.json.gz") == 2
    assert blocked.read_text() == "not a folder"


def test_the_provider_keeps_its_models_under_its_home(aws: Any, tmp_path: Path) -> None:
    """Through the real provider and the stand-in: a plan reads its models from the cache."""
    from cloudtrain.providers.aws.provider import AwsProvider
    from cloudtrain.provision.provider import ProviderContext

    def provider() -> AwsProvider:
        options = {"regions": ["us-east-1"], "owner": "tester"}
        return AwsProvider(ProviderContext(home=tmp_path / "home", options=options))

    assert provider().describe("exp1") == []
    folder = tmp_path / "home" / "cache" / "botocore"
    assert len(kept(folder)) == 2
    before = {p: p.stat().st_mtime_ns for p in kept(folder)}
    assert provider().describe("exp1") == []
    assert {p: p.stat().st_mtime_ns for p in kept(folder)} == before, "read, not written"
