"""The ssh provider's host list: ``--hosts`` and inventory files, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.providers.ssh.hosts import Host, load_inventory, parse_hosts

INVENTORY = """\
user: ubuntu
identity: keys/lab
known_hosts: /etc/ssh/known
python: /opt/venv/bin/python
gpus: 8
hosts:
  - address: 10.0.0.5
    port: 2222
  - address: 10.0.0.6
    user: admin
    identity: ~/.ssh/other
    gpus: 4
  - root@10.0.0.7:23
  - 10.0.0.8
"""


def test_an_inventory_gives_defaults_that_each_host_may_override(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(INVENTORY)
    inv = load_inventory(path)
    assert inv.hosts == (
        Host("ubuntu", "10.0.0.5", 2222, None, 8),
        Host("admin", "10.0.0.6", 22, str(Path("~/.ssh/other").expanduser()), 4),
        Host("root", "10.0.0.7", 23, None, 8),
        Host("ubuntu", "10.0.0.8", 22, None, 8),
    )
    assert inv.identity == str(tmp_path / "keys" / "lab")  # relative to the file
    assert (inv.known_hosts, inv.python) == ("/etc/ssh/known", "/opt/venv/bin/python")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hosts: []", "'hosts' must be a non-empty list"),
        ("host: [a@b]", "unknown field 'host'; did you mean 'hosts'?"),
        ("hosts: [{address: a, prot: 2}]", r"hosts\[0\]: unknown field 'prot'; did you mean"),
        ("hosts: [{address: a}]", r"hosts\[0\]: no 'user'"),
        ("user: u\nhosts: [{address: a, port: x}]", "port 'x' is not a port number"),
        ("user: u\nhosts: [{address: a, port: 70000}]", "port 70000 is not a port number"),
        ("user: u\ngpus: -1\nhosts: [a]", r"hosts\[0\]: gpus -1 is not a count"),
        ("user: u\nhosts: [a, a]", "names the same host twice"),
        ("user: u\nhosts: [{port: 22}]", r"hosts\[0\]: 'address' is required"),
        ("- a\n- b", "expected a mapping with 'hosts', got list"),
        ("hosts: [a: b: c]", "not YAML"),
    ],
)
def test_a_bad_inventory_names_the_file_the_field_and_the_value(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_inventory(path)


def test_hosts_flag() -> None:
    assert parse_hosts("a@h1,b@h2:2200") == [Host("a", "h1"), Host("b", "h2", 2200)]
    with pytest.raises(ConfigError, match="write user@address"):
        parse_hosts("h1")
    with pytest.raises(ConfigError, match=r"not a file|No such file"):
        load_inventory(Path("/nonexistent/inv.yaml"))


def test_what_the_bootstrap_may_install_on_your_machines(tmp_path: Path) -> None:
    """--python: check-only with that interpreter. Without it: a venv per node (nothing
    system-wide). --allow-sudo: also system packages and a missing driver, through sudo."""
    from cloudtrain.providers.ssh.provider import SshProvider
    from cloudtrain.provision.provider import ProviderContext

    def provider(**options: object) -> SshProvider:
        return SshProvider(ProviderContext(home=tmp_path, options={"hosts": "u@h", **options}))

    checked = provider(python="/opt/py/bin/python")
    assert (checked.install, checked.phases) == (False, "python torch cloudtrain verify")
    venv = provider()
    assert (venv.install, venv.phases) == (True, "python torch cloudtrain verify")
    sudo = provider(allow_sudo=True, torch_index="https://mirror.example/whl/cu126")
    assert sudo.phases == "base nvidia-driver python torch cloudtrain verify"
    assert sudo.torch_index == "https://mirror.example/whl/cu126"
    with pytest.raises(ConfigError, match="give --hosts or --inventory, not both"):
        provider(inventory=str(tmp_path / "x.yaml"))


def test_the_trust_warning_names_every_host_and_the_rule_to_add() -> None:
    from cloudtrain.providers.ssh.provider import trust_warning

    text = trust_warning(["10.0.0.5", "10.0.0.6"])
    assert "listens on 10.0.0.5, 10.0.0.6" in text
    assert "'ufw allow proto tcp from 10.0.0.5' 'ufw allow proto tcp from 10.0.0.6'" in text
    assert "\n" not in text


def test_a_host_whose_ssh_connection_breaks_is_unreachable_not_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ssh's own 255 (the connection broke) is no answer: the node is `unreachable`, kept,
    never "no longer run" (which ended a bootstrap's wait once, under load); a host that
    answers that the node's file is missing has no node."""
    from cloudtrain.executors.base import RunResult
    from cloudtrain.providers.ssh.provider import SshProvider
    from cloudtrain.provision.provider import ProviderContext

    provider = SshProvider(ProviderContext(home=tmp_path, options={"hosts": "u@h1,u@h2"}))
    codes = {"h1": 255, "h2": 1}

    class Stub:
        def __init__(self, host: Host) -> None:
            self.host = host

        def run(self, argv: object, **kwargs: object) -> RunResult:
            return RunResult(("cat",), codes[self.host.address], "", "broken pipe")

        def release(self) -> None:
            pass

    monkeypatch.setattr(provider, "_executor", Stub)
    found = provider.describe("c")
    assert [(n.index, n.state) for n in found] == [(0, "unreachable")]
