"""Bearer tokens in files (`--token-file`, the Spark source's `tokenFile`): read the same way by
the service and by every consumer, so a file that works for one works for the other."""

from __future__ import annotations

from csnd.core.errors import ConfigError


def read_token_file(path: str) -> str:
    """The token in `path` (surrounding whitespace dropped); ConfigError if there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"cannot read the token file {path}: {reason}") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"token file {path} must hold one token (no spaces inside)")
    return token
