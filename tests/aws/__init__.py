"""A local stand-in for AWS (moto's server app plus shims for its gaps) and its fixtures."""
