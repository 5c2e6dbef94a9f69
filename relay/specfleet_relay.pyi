class Pump:
    """Plain token chunks relayed from the engine's socket to the client's, natively."""

    last_read: float
    last_token: float
    chunks: int
    engine_fd: int

    def __init__(self, engine_fd: int, client_fd: int, separator: bytes) -> None: ...
    def pump(self) -> tuple[bytes, bytes] | None: ...
    def close(self) -> None: ...
