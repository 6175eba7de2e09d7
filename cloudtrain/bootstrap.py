"""User-data for new nodes, rendered from `templates/` (Jinja2, StrictUndefined).

Today: the minimal cloud-init every cloud node gets (the cloudtrain user and the cluster's
public key). The phased bootstrap (driver, CUDA-matched torch, NCCL, verify) will render here too.
"""

from __future__ import annotations

from importlib.resources import files

from cloudtrain import __version__


def render(template: str, **values: object) -> str:
    """Render ``templates/<template>``; a missing value is an error, never an empty string."""
    import jinja2

    text = files("cloudtrain.templates").joinpath(template).read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(text).render(version=__version__, **values)


def minimal_user_data(public_key: str) -> str:
    """cloud-init user-data: a `cloudtrain` user with the cluster's public key."""
    if "\n" in public_key or not public_key.startswith(("ssh-ed25519 ", "ssh-rsa ", "ecdsa-")):
        raise ValueError("public_key must be one OpenSSH public key line")
    return render("cloud-init-minimal.yaml.j2", public_key=public_key)
