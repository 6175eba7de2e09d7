"""``cloudtrain bootstrap render``: the user-data a node would get, for review and debugging."""

from __future__ import annotations

import gzip

import click

from cloudtrain.cli.app import App

pass_app = click.make_pass_decorator(App)


@click.group()
def bootstrap() -> None:
    """The node bootstrap (cloud-init user-data and the phased script)."""


@bootstrap.command()
@click.option("--provider", "-p", required=True, help="A provider whose nodes boot from user-data.")
@click.option("--gpus", help="Accelerator and count per node, e.g. V100:1 (default: CPU).")
@click.option("--instance-type", help="Override the machine type the catalog picks.")
@pass_app
def render(app: App, provider: str, gpus: str | None, instance_type: str | None) -> None:
    """Print the user-data of a PROVIDER node with GPUS, keys replaced by placeholders."""
    from typing import cast

    from cloudtrain.boot import bootstrap as boot
    from cloudtrain.errors import ConfigError
    from cloudtrain.model import Capability
    from cloudtrain.plan import catalog
    from cloudtrain.provision import registry
    from cloudtrain.provision.provider import BootsFromUserData
    from cloudtrain.spec import parse_gpus, validate_provider

    validate_provider(provider, registry.known(), "--provider")
    cls = registry.provider_class(provider)
    if Capability.USER_DATA not in cls.capabilities:
        raise ConfigError(
            f"--provider {provider!r}: its nodes do not boot from user-data; those that do: "
            f"{', '.join(registry.offering(Capability.USER_DATA))}"
        )
    accelerator, count = None, 0
    if gpus:
        accelerator, count = parse_gpus(gpus, catalog.load().accelerators(), "--gpus")
    if accelerator and instance_type is None:
        instance_type = catalog.load().resolve(provider, accelerator, count)[0].instance_type
    shape = boot.NodeShape(provider, accelerator, count, instance_type)
    fields = cast("BootsFromUserData", cls).user_data(shape, boot.NodeKeys.placeholders())
    for field, raw in fields.items():
        note = ""
        if raw.startswith(boot.GZIP_MAGIC):
            note = f" (sent gzip-compressed: {len(raw)} bytes)"
            raw = gzip.decompress(raw)
        app.err.print(f"# --- {provider} {field}{note} ---", markup=False)
        click.echo(raw.decode(), nl=False)


COMMANDS = (bootstrap,)
