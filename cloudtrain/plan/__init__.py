"""From a spec to priced offers: the catalog and the planner (pure; no cloud call)."""
