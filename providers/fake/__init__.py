"""An in-memory provider for tests: a fake cloud that records what was asked of it."""
