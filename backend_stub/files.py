"""The local spool: one partial file per attempt, written by the export and then published to the result store."""
from __future__ import annotations

from pathlib import Path


class ResultFiles:
    def __init__(self, data_dir: str) -> None:
        self.root = Path(data_dir) / "files"
        self.root.mkdir(parents=True, exist_ok=True)

    def partial(self, task_id: str, attempt: int) -> Path:
        return self.root / f"{task_id}.a{attempt}.part"

    def remove_partials(self, task_id: str) -> None:
        """Left behind by an attempt whose worker died; a new attempt starts clean."""
        for path in self.root.glob(f"{task_id}.a*.part"):
            path.unlink(missing_ok=True)
