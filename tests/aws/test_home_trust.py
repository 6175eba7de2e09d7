"""What the AWS provider keeps in the home is trusted only when no one else could have made it:
a marshal cache file resealed without the home's secret is a miss (rebuilt from botocore's
JSON), a cache folder of another user's is refused, and keys another user planted never reach
a node's user-data (nothing is made)."""

from __future__ import annotations

import hashlib
import marshal
import os
import pwd
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import access
from cloudtrain.errors import ConfigError
from cloudtrain.providers.aws import _models
from cloudtrain.providers.aws._client import Clients
from cloudtrain.providers.aws.provider import AwsProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec, Resources
from tests.aws.standin import StandIn, put_dlami_parameter, register_dlami

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files to another user")


def ec2_model(models: Path) -> dict[str, Any]:
    raw: dict[str, Any] = (
        Clients(models=models).ec2("us-east-1").meta.service_model._service_description
    )
    return raw


def reseal(path: Path, change: Any) -> None:
    """Rewrite the cache file at `path` as someone who can write the folder but does not hold
    the key would: a changed body and a digest made without a key, as the format had it."""
    blob = path.read_bytes()
    version, size, mtime, _ = _models._HEADER.unpack_from(blob)
    model = marshal.loads(blob[_models._HEADER.size :])
    change(model)
    body = marshal.dumps(model)
    digest = hashlib.blake2b(body, digest_size=_models._DIGEST).digest()
    path.write_bytes(_models._HEADER.pack(version, size, mtime, digest) + body)


def biggest(folder: Path) -> Path:
    return max(folder.glob("*.marshal"), key=lambda p: p.stat().st_size)  # EC2's model


def test_a_resealed_cache_file_is_not_trusted_but_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "home" / "cache" / "botocore"
    good = ec2_model(folder)

    def planted(model: dict[str, Any]) -> None:
        model["metadata"]["endpointPrefix"] = "attacker"

    path = biggest(folder)
    reseal(path, planted)
    assert ec2_model(folder) == good, "the resealed file was read as the model"
    assert ec2_model(folder)["metadata"]["endpointPrefix"] == "ec2"
    assert marshal.loads(path.read_bytes()[_models._HEADER.size :]) == good, "written over"
    key = folder / _models.KEY_FILE  # what the digests are keyed with
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_bytes()) == 32


def test_a_key_others_could_read_is_replaced_and_its_files_are_misses(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "botocore"
    ec2_model(folder)
    key = folder / _models.KEY_FILE
    old = key.read_bytes()
    key.chmod(0o644)  # anyone could have read it, and sealed a file with it
    path = biggest(folder)
    before = path.stat().st_mtime_ns
    ec2_model(folder)
    assert key.read_bytes() != old
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert path.stat().st_mtime_ns != before, "keyed with the old secret: a miss, written over"


@as_root
@pytest.mark.parametrize("where", ["cache", "cache/botocore"])
def test_a_cache_folder_of_another_user_is_refused(tmp_path: Path, where: str) -> None:
    home = tmp_path / "home"
    ec2_model(home / "cache" / "botocore")
    os.chown(home / where, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(ConfigError) as refused:
        ec2_model(home / "cache" / "botocore")
    assert str(refused.value).startswith(f"cache folder {home / where} is owned by nobody (uid ")


def test_a_cache_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "home" / "cache" / "aws"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    from cloudtrain.providers.aws._cache import PlanCache

    with pytest.raises(ConfigError, match=f"cache folder {folder} is writable by other users"):
        PlanCache(folder, "caller", "us-east-1").get("zones")


@as_root
def test_planted_keys_never_reach_user_data_and_nothing_is_made(
    aws: StandIn, tmp_path: Path
) -> None:
    regions = ["us-east-1", "us-west-2", "eu-west-1"]
    for region in regions:
        put_dlami_parameter(aws.client("ssm", region), register_dlami(aws.client("ec2", region)))
    home = tmp_path / "home"
    access.host_key(tmp_path / "attacker", "small")  # the pair whose private half they keep
    (home / "keys").mkdir(parents=True, mode=0o700)
    shutil.copytree(tmp_path / "attacker" / "keys" / "small", home / "keys" / "small")
    for path in [home / "keys" / "small", *(home / "keys" / "small").iterdir()]:
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    options: dict[str, Any] = {"poll_s": 0.01, "regions": regions, "owner": "tester"}
    provider = AwsProvider(ProviderContext(home=home, options=options))
    spec = ClusterSpec(
        "small",
        "aws",
        1,
        Resources(accelerator="V100", count=1),
        ssh_cidr="203.0.113.7/32",
        cluster_id="0123456789ab",
    )
    with pytest.raises(ConfigError, match=f"key folder {home / 'keys' / 'small'} is owned by"):
        provider.apply(provider.plan(spec))
    reads = ("Describe", "Get", "RegisterImage")
    assert [c.action for c in aws.app.calls(service=None) if not c.action.startswith(reads)] == []
