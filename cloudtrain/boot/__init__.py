"""What a new node gets and how it is watched: the user-data, the GPU stack table,
readiness, the wheel."""
