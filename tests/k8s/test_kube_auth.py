"""Credentials as EKS, GKE and AKS kubeconfigs give them: an exec plugin (``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin``) that prints an ExecCredential with a short-lived
token. The official client runs it, and runs it again when the token expires: every call of
the provider, exec's WebSocket included, gets a fresh one. A plugin that fails is one line
naming the context and what the plugin said, before any call."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cloudtrain.errors import AuthError
from cloudtrain.providers.kubernetes.provider import KubernetesProvider
from cloudtrain.provision.provider import ProviderContext
from cloudtrain.spec import ClusterSpec
from tests.k8s.standin import StandIn

#: A plugin as the clouds' are: each run a new token, valid for a second (the client takes a
#: token that ends within five minutes as ended, so it runs the plugin again for each call).
PLUGIN = """\
import datetime, json, os, sys
runs = os.environ["RUNS"]
with open(runs, "a") as f:
    f.write("run\\n")
n = sum(1 for _ in open(runs))
if os.environ.get("FAIL"):
    sys.exit("error: the SSO session has expired; run aws sso login")
ends = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": {"token": f"{os.environ['BASE']}-{n}",
               "expirationTimestamp": ends.strftime("%Y-%m-%dT%H:%M:%SZ")},
}))
"""


def with_plugin(k8s: StandIn, tmp_path: Path, *, fail: bool = False) -> tuple[Path, Path]:
    """A kubeconfig of the stand-in whose user is `PLUGIN`, and the file counting its runs."""
    script, runs = tmp_path / "plugin.py", tmp_path / "runs"
    script.write_text(PLUGIN)
    env = [{"name": "RUNS", "value": str(runs)}, {"name": "BASE", "value": "tok"}]
    if fail:
        env.append({"name": "FAIL", "value": "1"})
    config = json.loads(k8s.kubeconfig_file.read_text())
    config["users"] = [
        {
            "name": "standin",
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": sys.executable,
                    "args": [str(script)],
                    "env": env,
                    "interactiveMode": "Never",
                }
            },
        }
    ]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path, runs


def test_an_exec_plugins_tokens_are_renewed_for_every_call_exec_included(
    k8s: StandIn, tmp_path: Path
) -> None:
    for n in range(1, 400):
        k8s.add_token(f"tok-{n}")
    kubeconfig, runs = with_plugin(k8s, tmp_path)
    k8s.add_node("n1", gpus=0)
    options = {"kubeconfig": str(kubeconfig), "wait": "20"}
    prov = KubernetesProvider(ProviderContext(home=tmp_path, options=options))
    spec = ClusterSpec("ex", "kubernetes", 1, cluster_id="c0ffee000002")
    [node] = prov.apply(prov.plan(spec))
    before = len(runs.read_text().splitlines())
    with k8s.lock:  # the tokens the plugin gave so far stop working: only a fresh one will do
        for n in range(1, before + 1):
            k8s.tokens.pop(f"tok-{n}", None)
    assert prov.executor(node).run(["echo", "hi"], timeout=30).check().stdout == "hi\n"
    assert len(runs.read_text().splitlines()) > before, "a fresh token for the exec"
    prov.terminate("ex", "c0ffee000002")
    assert k8s.is_empty(), k8s.leftovers()


def test_a_plugin_that_fails_is_one_line_and_no_call(
    k8s: StandIn, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    kubeconfig, _ = with_plugin(k8s, tmp_path, fail=True)
    prov = KubernetesProvider(ProviderContext(home=tmp_path, options={"kubeconfig": kubeconfig}))
    spec = ClusterSpec("ex", "kubernetes", 1, cluster_id="c0ffee000003")
    with pytest.raises(AuthError) as refused:
        prov.plan(spec)
    said = str(refused.value)
    assert "\n" not in said
    assert f"context 'standin' of {kubeconfig}: its credential plugin failed: " in said
    assert "the SSO session has expired; run aws sso login" in said
    assert k8s.calls() == []
    assert "SSO" not in capfd.readouterr().err, "the client's log line is not printed too"


def test_inside_a_pod_its_service_account_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No kubeconfig, inside a pod: the service account's token, CA and namespace, over TLS
    (the client's in-cluster config insists on https), exec's WebSocket included."""
    from kubernetes.config import incluster_config

    from cloudtrain.providers.kubernetes import _api
    from cloudtrain.provision.credentials import present

    with StandIn(namespaces=("team",), tls=True) as k8s:
        assert k8s.ca_file is not None
        account = tmp_path / "serviceaccount"
        account.mkdir()
        (account / "token").write_text(k8s.token)
        (account / "ca.crt").write_bytes(k8s.ca_file.read_bytes())
        (account / "namespace").write_text("team")
        monkeypatch.setattr(_api, "SERVICE_ACCOUNT", account)
        monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(account / "token"))
        monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(account / "ca.crt"))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(k8s.port))
        monkeypatch.delenv("KUBECONFIG", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
        assert present("kubernetes").source == "this pod's service account"

        k8s.add_node("n1", gpus=0)
        prov = KubernetesProvider(ProviderContext(home=tmp_path, options={"wait": "20"}))
        spec = ClusterSpec("in", "kubernetes", 1, cluster_id="c0ffee000004")
        [node] = prov.apply(prov.plan(spec))
        assert prov.api.namespace == "team"
        assert prov.api.host == k8s.url
        assert prov.executor(node).run(["echo", "hi"], timeout=30).check().stdout == "hi\n"
        prov.terminate("in", "c0ffee000004")
        assert k8s.is_empty(), k8s.leftovers()
