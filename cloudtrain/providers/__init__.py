"""Built-in providers; each folder holds the same file names (provider.py …)."""
