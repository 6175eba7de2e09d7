"""Every user-data variant, checked by cloud-init's own validator and by shellcheck."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import pytest
import yaml

from cloudtrain.boot import bootstrap
from cloudtrain.boot.bootstrap import NodeKeys, NodeShape
from cloudtrain.node import notices
from cloudtrain.plan.catalog import load
from cloudtrain.providers.aws import _instances as aws_instances
from cloudtrain.providers.azure import _instances as azure_instances
from cloudtrain.providers.gcp import _instances as gcp_instances
from cloudtrain.provision import registry
from cloudtrain.provision.provider import BootsFromUserData
from tests.conftest import Cli, require_tool

SHAPES = [("V100", 1), ("V100", 8), ("V100-32GB", 8), ("A100", 8), ("A100-80GB", 1), (None, 0)]


#: What each cloud's user-data field takes.
LIMITS = {"aws": aws_instances.USER_DATA_LIMIT, "gcp": gcp_instances.METADATA_LIMIT,
          "azure": azure_instances.CUSTOM_DATA_LIMIT}  # fmt: skip


def user_data(shape: NodeShape, node_keys: NodeKeys) -> dict[str, bytes]:
    """What `shape`'s provider boots a node with."""
    cls = registry.provider_class(shape.provider)
    return cast("BootsFromUserData", cls).user_data(shape, node_keys)


#: The preemption notices each cloud's spot nodes watch.
NOTICES = {"aws": notices.IMDSV2, "gcp": notices.GCE_METADATA, "azure": notices.SCHEDULED_EVENTS}


def variants() -> list[NodeShape]:
    """Each provider × the shapes of SHAPES its catalog offers (CPU-only always), on demand
    and spot (whose nodes also get the agent's unit)."""
    out = []
    for provider in ("aws", "gcp", "azure"):
        for accelerator, count in SHAPES:
            if accelerator is None:
                out += [NodeShape(provider), NodeShape(provider, notices=NOTICES[provider])]
                continue
            rows = load().find(provider=provider, accelerator=accelerator, count=count)
            if rows:
                itype = rows[0].instance_type
                out.append(NodeShape(provider, accelerator, count, itype))
                out.append(NodeShape(provider, accelerator, count, itype, NOTICES[provider]))
    return [*out, NodeShape("aws", backstop_min=3)]  # a lifetime, kept by the guest too


def keys(tmp_path: Path) -> NodeKeys:
    return NodeKeys.for_cluster(tmp_path / "home", "c1")


def tool(name: str) -> str:
    return require_tool(name)


def test_the_variants_cover_every_provider() -> None:
    shapes = {(v.provider, v.accelerator, v.count) for v in variants()}
    assert ("aws", "V100", 1) in shapes
    assert ("azure", "V100", 1) not in shapes  # retired: Azure has no V100:1 any more
    assert ("gcp", "A100", 8) in shapes
    assert len(shapes) >= 12


def test_every_cloud_config_passes_cloud_inits_schema(tmp_path: Path) -> None:
    validator = tool("cloud-init")
    node_keys = keys(tmp_path)

    def check(
        index_shape: tuple[int, NodeShape],
    ) -> tuple[NodeShape, subprocess.CompletedProcess[str]]:
        index, shape = index_shape
        path = tmp_path / f"user-data-{index}.yaml"
        path.write_text(bootstrap.cloud_config(shape, node_keys))
        done = subprocess.run([validator, "schema", "--config-file", str(path)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        return shape, done

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(check, enumerate(variants())))
    for shape, done in results:
        assert done.returncode == 0, f"{shape.provider} {shape}: {done.stdout}{done.stderr}"
        assert "Valid cloud-config" in done.stdout


def test_every_startup_script_and_the_bootstrap_pass_shellcheck(tmp_path: Path) -> None:
    checker = tool("shellcheck")
    paths = []
    for index, shape in enumerate(variants()):
        path = tmp_path / f"startup-{index}.sh"
        path.write_text(bootstrap.startup_script(shape, keys(tmp_path)))
        paths.append(str(path))
    done = subprocess.run([checker, "-s", "bash", "-S", "style", *paths],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout


def test_the_cloud_config_holds_what_the_node_needs(tmp_path: Path) -> None:
    node_keys = keys(tmp_path)
    shape = NodeShape("aws", "V100", 1, "p3.2xlarge")
    doc = yaml.safe_load(bootstrap.cloud_config(shape, node_keys))
    user = next(u for u in doc["users"] if isinstance(u, dict))
    assert user["name"] == "cloudtrain"
    assert user["ssh_authorized_keys"] == [node_keys.user_public]
    assert doc["ssh_keys"]["ed25519_public"] == node_keys.host_public
    assert doc["ssh_keys"]["ed25519_private"].strip() == node_keys.host_private.strip()
    files = {f["path"]: f for f in doc["write_files"]}
    script = gzip.decompress(base64.b64decode(files["/usr/local/lib/cloudtrain/bootstrap.sh"][
        "content"]))  # fmt: skip
    assert script.decode() == bootstrap.script()
    env = tmp_path / "bootstrap.env"
    env.write_text(files["/etc/cloudtrain/bootstrap.env"]["content"])
    sourced = subprocess.run(
        ["bash", "-c", 'set -eu; . "$1"; echo "$CT_TORCH_INDEX $CT_GPU_COUNT $CT_DRIVER_BRANCH"',
         "sh", str(env)], capture_output=True, text=True, check=True,
    )  # fmt: skip
    index, count, branch = sourced.stdout.split()
    assert "/whl/cu12" in index, "V100 (sm_70) needs a CUDA 12.x build"
    assert count == "1"
    assert branch.isdigit()
    assert doc["runcmd"][3] == ["bash", "/usr/local/lib/cloudtrain/bootstrap.sh",
                                "/etc/cloudtrain/bootstrap.env"]  # fmt: skip
    unit = files["/etc/systemd/system/cloudtrain-agent.service"]["content"].splitlines()
    root = "/home/cloudtrain/.cloudtrain"
    line = f"ExecStart={root}/venv/bin/python -m cloudtrain.node agent --root {root} --halt"
    assert line in unit, "an on-demand node has its resident agent too, watching no notice"


@pytest.mark.parametrize("provider", sorted(NOTICES))
def test_a_spot_node_starts_its_agent_before_the_bootstrap(tmp_path: Path, provider: str) -> None:
    """The unit runs the resident agent as the cloudtrain user, watching the provider's
    notices, from the start: it is enabled before the bootstrap runs and comes back whenever
    it stops (until the venv has cloudtrain, and after)."""
    from cloudtrain.model import Offer

    spot = Offer(
        provider, "r", ("z",), "t", 1.0, spot=True, accelerator="A100", accelerator_count=8
    )
    shape = NodeShape.of(spot, NOTICES[provider])
    assert NodeShape.of(dataclasses.replace(spot, spot=False), NOTICES[provider]).notices is None
    root = "/home/cloudtrain/.cloudtrain"
    watch = f"-m cloudtrain.node agent --root {root} --halt --source {NOTICES[provider]}"
    if provider == "azure":  # a powered-off VM still bills: it deletes itself through ARM
        shape = dataclasses.replace(shape, halt="arm")
        watch = watch.replace("--halt", "--halt arm")
    doc = yaml.safe_load(bootstrap.cloud_config(shape, keys(tmp_path)))
    unit = {f["path"]: f for f in doc["write_files"]}[
        "/etc/systemd/system/cloudtrain-agent.service"
    ]
    lines = unit["content"].splitlines()
    assert "User=cloudtrain" in lines
    assert f"ExecStart={root}/venv/bin/python {watch}" in lines
    assert "Restart=always" in lines
    enable = doc["runcmd"].index(["systemctl", "enable", "--now", "cloudtrain-agent.service"])
    assert enable < doc["runcmd"].index(
        ["bash", "/usr/local/lib/cloudtrain/bootstrap.sh", "/etc/cloudtrain/bootstrap.env"]
    )
    script = bootstrap.startup_script(shape, keys(tmp_path))
    assert script.index("systemctl enable --now cloudtrain-agent") < script.index("bash /usr/")


def test_no_secret_and_every_variant_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    node_keys = keys(tmp_path)
    user_private = (tmp_path / "home" / "keys" / "c1" / "id_ed25519").read_text()
    body = "".join(user_private.splitlines()[1:-1])[80:140]  # past the format's fixed header
    for shape in variants():
        for field, raw in user_data(shape, node_keys).items():
            assert len(raw) <= LIMITS[shape.provider], (shape, field)
            text = (gzip.decompress(raw) if raw[:2] == bootstrap.GZIP_MAGIC else raw).decode()
            assert "wJalrXUtnFEMI" not in text
            assert body not in text.replace("\n", ""), "the user's private key leaked"


def test_too_long_user_data_is_gzipped_and_cloud_init_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = bootstrap.cloud_config(NodeShape("aws", "A100", 8, "p4d.24xlarge"), keys(tmp_path))
    assert bootstrap.fit(doc, len(doc), "EC2 UserData") == doc.encode()
    packed = bootstrap.fit(doc, len(doc) - 1, "EC2 UserData")
    assert packed[:2] == bootstrap.GZIP_MAGIC
    assert gzip.decompress(packed).decode() == doc
    with pytest.raises(ValueError, match="EC2 UserData takes 100"):
        bootstrap.fit(doc, 100, "EC2 UserData")
    tool("cloud-init")  # its library reads user-data as a booting node does
    path = tmp_path / "user-data.gz"
    path.write_bytes(packed)
    reader = (
        "import sys\n"
        "from cloudinit import user_data\n"
        "from cloudinit.handlers import type_from_starts_with\n"
        "msg = user_data.convert_string(open(sys.argv[1], 'rb').read())\n"
        "part = [p for p in msg.walk() if p.get_content_maintype() != 'multipart'][0]\n"
        "text = part.get_payload(decode=True).decode()\n"
        "print(type_from_starts_with(text), len(text))\n"
    )
    done = subprocess.run(["/usr/bin/python3", "-c", reader, str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.stdout.split() == ["text/cloud-config", str(len(doc))], done.stderr


def test_bootstrap_render_prints_placeholders_not_keys(run_cli: Cli, home: Path) -> None:
    result = run_cli("bootstrap", "render", "--provider", "gcp", "--gpus", "V100:1")
    assert result.exit_code == 0, result.output
    assert "#cloud-config" in result.output
    assert "# --- gcp startup-script" in result.output
    assert "<the cluster's public key>" in result.output
    assert "PRIVATE KEY" not in result.output
    assert not (home / "keys").exists()
    bad = run_cli("bootstrap", "render", "--provider", "aws", "--gpus", "V100:2")
    assert bad.exit_code == 2
    assert "aws offers V100 with 1, 4 or 8" in bad.output
    local = run_cli("bootstrap", "render", "--provider", "local")
    assert local.exit_code == 2
    assert "its nodes do not boot from user-data; those that do: aws, azure, gcp" in local.output


def test_the_users_warm_switch_at_up_reaches_every_nodes_bootstrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CLOUDTRAIN_WARM=0`` where `up` runs travels in the config (``CT_WARM``): an ssh host
    or a Slurm node's bootstrap does not see the user's environment."""
    monkeypatch.delenv("CLOUDTRAIN_WARM", raising=False)
    assert "CT_WARM=1\n" in bootstrap.config(NodeShape("ssh"))
    monkeypatch.setenv("CLOUDTRAIN_WARM", "0")
    assert "CT_WARM=0\n" in bootstrap.config(NodeShape("ssh"))
