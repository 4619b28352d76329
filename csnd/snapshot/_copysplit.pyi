from typing import Any

def split_rows(buf: bytes | bytearray, pos: int, end: int) -> tuple[list[bytes], int, int]: ...
def render_rows(
    codes: bytes,
    keys: tuple[bytes, ...],
    quote: Any,
    builders: tuple[Any, ...],
    buf: bytes | bytearray,
    pos: int,
    end: int,
    prefix: bytes,
) -> tuple[bytes | None, int, int, int]: ...
def read_copy(pgconn: int, get_copy_data: int, free_mem: int) -> tuple[bytes, int]: ...
