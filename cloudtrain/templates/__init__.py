"""Templates rendered by cloudtrain (read through importlib.resources.files)."""
