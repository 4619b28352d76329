from collections.abc import Sequence

def encode_frames(
    csns: Sequence[int],
    payloads: Sequence[bytes],
    time_us: int,
    after_csn: int,
    max_payload: int,
    prev_crc: int,
) -> list[bytes]: ...

FRAME_HEAD: int
