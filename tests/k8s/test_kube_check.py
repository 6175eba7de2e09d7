"""`cloudtrain check --provider kubernetes` against the stand-in, through the official client:
who the credentials are (SelfSubjectReview), whether the Role grants each verb `up`, `train`
and `down` use (SelfSubjectAccessReview), and what the namespace's ResourceQuota leaves of GPUs;
and the Role the guide tells users to grant is the one checked."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from cloudtrain.providers.kubernetes._check import RULES
from cloudtrain.providers.kubernetes._quantity import parse
from tests.conftest import Cli
from tests.k8s.standin import USER, StandIn

REPO = Path(__file__).resolve().parents[2]


def check(run_cli: Cli, *args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli("check", "--provider", "kubernetes", "--json", *args)
    return done.exit_code, json.loads(done.output)["clouds"][0]


def test_allowed_credentials_with_gpu_quota_left_are_usable(k8s: StandIn, run_cli: Cli) -> None:
    k8s.set_quota("default", "team-gpus", {"requests.nvidia.com/gpu": "20", "pods": "1k"})
    code, found = check(run_cli, "--gpus", "A100:8", "--gpus", "V100:4")
    assert code == 0, found
    assert found["usable"]
    assert found["valid"]
    assert found["findings"] == []
    assert found["identity"] == f"{USER}, namespace default"
    assert found["source"] == f"kubeconfig {k8s.kubeconfig_file}"
    quotas = {q["name"]: q for q in found["quotas"]}
    gpus = quotas["ResourceQuota team-gpus: requests.nvidia.com/gpu"]
    assert (gpus["limit"], gpus["used"], gpus["unit"]) == (20, 0, "GPUs")
    assert quotas["ResourceQuota team-gpus: pods"]["limit"] == 1000
    room = {r["instance_type"]: r["nodes"] for r in found["room"]}
    assert room == {"A100:8": 2, "V100:4": 5}, "the GPUs bind, not the pods"
    reviews = k8s.calls("create", "selfsubjectaccessreviews")
    assert len(reviews) == sum(len(verbs) for verbs in RULES.values())
    made = {c.resource for c in k8s.calls("create")}
    assert made == {"selfsubjectreviews", "selfsubjectaccessreviews"}, "a check makes nothing"


def test_a_verb_the_role_lacks_blocks_and_says_what_to_grant(k8s: StandIn, run_cli: Cli) -> None:
    k8s.forbid("create", "pods", "exec")
    k8s.forbid("deletecollection", "pods")
    code, found = check(run_cli)
    assert code == 1
    assert not found["usable"]
    assert found["valid"]
    problems = {f["problem"]: f for f in found["findings"]}
    assert set(problems) == {
        "may not create pods/exec in namespace default",
        "may not deletecollection pods in namespace default",
    }
    assert all(f["blocks"] and "docs/guide/kubernetes.md" in f["fix"] for f in problems.values())
    text = run_cli("check", "--provider", "kubernetes").output
    assert "kubernetes: may not create pods/exec in namespace default" in text


def test_a_quota_with_no_room_for_one_node_is_not_usable(k8s: StandIn, run_cli: Cli) -> None:
    k8s.set_quota("default", "small", {"requests.nvidia.com/gpu": "4"})
    code, found = check(run_cli, "--gpus", "A100:8")
    assert code == 1
    assert not found["usable"]
    [short] = found["findings"]
    assert short["problem"].startswith("ResourceQuota small: requests.nvidia.com/gpu in every")
    assert "4 GPUs left, the smallest machine of interest needs 8" in short["problem"]
    assert (
        "raise it to at least 8 GPUs: ask the cluster's admins (namespace default)" in short["fix"]
    )


def test_quotas_that_may_not_be_read_are_a_finding_not_a_failure(
    k8s: StandIn, run_cli: Cli
) -> None:
    k8s.forbid("list", "resourcequotas")
    code, found = check(run_cli, "--gpus", "A100:8")
    assert code == 0
    assert found["usable"]
    [unread] = found["findings"]
    assert unread["problem"].startswith("the namespace's quotas not read: Forbidden: list the")
    assert unread["fix"] == "allow list resourcequotas"
    assert not unread["blocks"]


def test_credentials_the_server_refuses_or_a_context_not_there_are_not_valid(
    k8s: StandIn, run_cli: Cli, tmp_path: Path, monkeypatch: Any
) -> None:
    stale = k8s.kubeconfig(tmp_path / "stale", token="expired")
    code, found = check(run_cli, "--kubeconfig", str(stale))
    assert code == 1
    assert found["valid"] is False
    [refused] = found["findings"]
    assert "is not accepted by" in refused["problem"]
    assert "aws eks update-kubeconfig" in refused["fix"]

    code, found = check(run_cli, "--context", "nope")
    assert code == 1
    assert found["valid"] is False
    assert "--context 'nope': " in found["findings"][0]["problem"]

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    calls = len(k8s.calls())
    code, found = check(run_cli)
    assert code == 1
    assert found["present"] is False
    assert found["findings"][0]["fix"].startswith("a kubeconfig (--kubeconfig, $KUBECONFIG")
    assert len(k8s.calls()) == calls, "no call without a kubeconfig"


def test_the_guides_role_is_the_one_checked() -> None:
    guide = (REPO / "docs" / "guide" / "kubernetes.md").read_text()
    [block] = re.findall(r"```yaml\n(kind: Role.*?|apiVersion: rbac.*?)```", guide, re.S)
    role = yaml.safe_load(block)
    granted = {
        (group, *(*resource.split("/"), "")[:2]): tuple(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == RULES


def test_quantities_read_as_the_api_server_reads_them() -> None:
    assert [parse(t) for t in ("8", "500m", "32Gi", "1.5k", "1e3", ".5")] == [
        8,
        0.5,
        32 * 2**30,
        1500,
        1000,
        0.5,
    ]
    assert [parse(t) for t in ("", "x", "1Gb", "1e99", "8 8", "9" * 70)] == [None] * 6


def test_an_api_server_that_does_not_answer_is_one_line_for_check_and_up(
    k8s: StandIn, run_cli: Cli, tmp_path: Path
) -> None:
    from tests.sshd import free_port

    dead = tmp_path / "dead"
    config = json.loads(k8s.kubeconfig_file.read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    dead.write_text(json.dumps(config))
    code, found = check(run_cli, "--kubeconfig", str(dead))
    assert code == 1
    assert found["valid"] is False
    [said] = found["findings"]
    assert "does not answer" in said["problem"]
    assert said["fix"].startswith("retry")

    up = run_cli("up", "--provider", "kubernetes", "--kubeconfig", str(dead), "--name", "x")
    assert up.exit_code != 0
    [line] = [t for t in up.output.splitlines() if t.startswith("error:")]
    assert "the API server at http://127.0.0.1:" in line
    assert "does not answer" in line
    assert "Traceback" not in up.output
    assert run_cli("status", "--json").output.count('"name"') == 0, "no record"


def test_cpu_and_memory_quotas_count_what_the_pods_ask(k8s: StandIn, run_cli: Cli) -> None:
    """A pod of A100:4 asks 8 CPUs and 32Gi by default (`_pods.requests`): a quota of 20 CPUs
    and 100Gi leaves room for 2 of them; and a quota that makes pods set CPU limits, which
    cloudtrain's do not, refuses `up` as a quota, in one line."""
    k8s.set_quota("default", "box", {"requests.cpu": "20", "requests.memory": "100Gi"})
    code, found = check(run_cli, "--gpus", "A100:4")
    assert code == 0
    quotas = {q["name"]: q for q in found["quotas"]}
    assert quotas["ResourceQuota box: requests.memory"]["limit"] == 100
    assert quotas["ResourceQuota box: requests.memory"]["unit"] == "GiB"
    assert quotas["ResourceQuota box: requests.cpu"]["unit"] == "CPUs"
    assert [r["nodes"] for r in found["room"]] == [2]

    k8s.set_quota("default", "box", {"limits.cpu": "20"})
    k8s.add_node("n1", gpus=0)
    up = run_cli("up", "--provider", "kubernetes", "--name", "lim")
    assert up.exit_code != 0
    [line] = [t for t in up.output.splitlines() if t.startswith("error:")]
    assert "QuotaExceeded" in line
    assert "failed quota: box: must specify cpu" in line
    assert k8s.calls("create", "pods")
    assert k8s.is_empty(), k8s.leftovers()
