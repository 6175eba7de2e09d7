"""Clusters on clouds: the provider contract, the provisioning engine, the registry."""
