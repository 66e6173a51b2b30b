"""An attempt's result file while it is written: buffered, compressed when the type says so, sized as it grows."""
from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from backend_stub.compression import compressing

BUFFER_BYTES = 1 << 20


class PartFile:
    def __init__(self, path: Path, compression: str | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._raw = open(path, "wb", buffering=BUFFER_BYTES)  # noqa: SIM115 - closed by finish() or __exit__
        self.stream: BinaryIO = compressing(self._raw, compression) if compression else self._raw

    def stored_bytes(self) -> int:
        """Bytes of the file so far (compressed, when it is), give or take what the compressor still holds."""
        return self._raw.tell()

    def finish(self) -> int:
        """End the file (the compressed stream's trailer included), make it durable; its final size."""
        if self.stream is not self._raw:
            self.stream.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        size = self._raw.tell()
        self._raw.close()
        return size

    def __enter__(self) -> PartFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stream.close()
        self._raw.close()
