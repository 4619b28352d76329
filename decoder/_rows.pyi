from collections.abc import Callable

def read_row(
    codes: bytes, keys: tuple[bytes, ...], quote: Callable[[str], str], data: bytes, pos: int, end: int
) -> tuple[str, int] | None: ...
