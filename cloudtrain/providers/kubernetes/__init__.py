"""The kubernetes provider: a cluster is a gang of pods in a Kubernetes cluster a team runs.

`up` makes one pod per node (the GPUs asked for, the image the user names, the labels that say
whose it is) and a headless Service; commands run through the API's exec, files travel as tar
streams through it, and `down` deletes everything by label. The official client reaches the
API server through the user's kubeconfig (its current context, or ``--context``) or, inside a
pod, its service account. See `cloudtrain.providers.kubernetes.provider`.
"""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import NODE_PRICE, Option

#: What `up --provider kubernetes` takes beyond the spec.
OPTIONS = (
    Option(
        "kubeconfig",
        "kubernetes: the kubeconfig file (default $KUBECONFIG, else ~/.kube/config; none: "
        "the pod's service account).",
        kind="path",
        account=True,
    ),
    Option(
        "context", "kubernetes: the kubeconfig's context (default: its current one).", account=True
    ),
    Option(
        "namespace",
        "kubernetes: the namespace of the pods (default: the context's, else 'default').",
        account=True,
    ),
    Option("queue", "kubernetes: Kueue's LocalQueue that admits the pods as one gang."),
    Option(
        "node_selector",
        "kubernetes: the nodes' labels the pods must run on, KEY=VALUE[,KEY=VALUE] (default: "
        "the GPU's product label, nvidia.com/gpu.product, where the GPU is known).",
    ),
    Option(
        "cpus",
        "kubernetes: CPUs each pod requests, e.g. 8 or 7.5 or 7500m (default: 2 per GPU, 1 "
        "without).",
    ),
    Option(
        "memory",
        "kubernetes: memory each pod requests, e.g. 32Gi (default: 8Gi per GPU, 2Gi without).",
    ),
    Option("wait", "kubernetes: seconds the pods may stay pending before `up` deletes them (300)."),
    Option("python", "kubernetes: the image's Python, with torch (default: python3)."),
    NODE_PRICE,
)

PLUGIN = laid_out(__name__, "KubernetesProvider", OPTIONS, checked=True)
