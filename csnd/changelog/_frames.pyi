from collections.abc import Sequence

def encode_frames(
    csns: Sequence[int],
    payloads: Sequence[bytes],
    time_us: int,
    after_csn: int,
    max_payload: int,
    prev_crc: int,
) -> list[bytes]: ...
def walk(
    buf: bytes | memoryview, start: int, last_csn: int, link: int, version: int
) -> tuple[int, list[int], list[int], list[int], int]: ...

FRAME_HEAD: int
