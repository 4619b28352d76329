from collections.abc import Callable
from typing import Any

def take_whole_txns(
    get_copy_data: Callable[[int], tuple[int, Any]], max_frames: int, max_changes: int, stop_at: int
) -> tuple[list[Any], list[tuple[int, Any]], int]: ...

HEADER: int
BEGIN_SIZE: int
COMMIT_SIZE: int
CHANGE_MIN: int

def bind_txn_type(cls: type[tuple[Any, ...]]) -> None: ...
def bind_libpq(version: int) -> str | None: ...

class CopyReader:
    def __init__(self, pgconn: Any, error_class: type[BaseException]) -> None: ...
    def __call__(self, async_: int) -> tuple[int, bytes]: ...
