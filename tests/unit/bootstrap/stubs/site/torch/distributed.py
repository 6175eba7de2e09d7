"""A fake torch.distributed: one process, so an all_reduce leaves the tensor as it is."""

_backend = ""


def init_process_group(backend: str, **kwargs: object) -> None:
    global _backend
    _backend = backend


def get_backend() -> str:
    return _backend


def get_world_size() -> int:
    return 1


def get_rank() -> int:
    return 0


def all_reduce(tensor: object) -> None:
    pass


def destroy_process_group() -> None:
    pass
