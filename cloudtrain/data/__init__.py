"""Catalog data shipped with cloudtrain (read through importlib.resources)."""
