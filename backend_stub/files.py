"""Where result files live: one final file per task, one partial file per attempt."""
from __future__ import annotations

from pathlib import Path


class ResultFiles:
    def __init__(self, data_dir: str) -> None:
        self.root = Path(data_dir) / "files"
        self.root.mkdir(parents=True, exist_ok=True)

    def final(self, task_id: str, fmt: str) -> Path:
        return self.root / f"{task_id}.{fmt}"

    def partial(self, task_id: str, attempt: int) -> Path:
        return self.root / f"{task_id}.a{attempt}.part"

    def remove_partials(self, task_id: str) -> None:
        """Left behind by an attempt whose worker died; a new attempt starts clean."""
        for path in self.root.glob(f"{task_id}.a*.part"):
            path.unlink(missing_ok=True)

    def remove_all(self, task_id: str) -> None:
        for path in self.root.glob(f"{task_id}.*"):
            path.unlink(missing_ok=True)
