from collections.abc import Callable

def read_row(
    codes: bytes,
    keys: tuple[bytes, ...],
    quote: Callable[[str], str],
    builders: tuple[tuple[Callable[[bytes], str], Callable[[str], str]], ...],
    data: bytes,
    pos: int,
    end: int,
) -> tuple[str, int] | None: ...
def one_change_line(node_key: str, commit_lsn: int, xid: int, commit_time: int, body: str) -> str | None: ...
