"""Batch-size measurements kept in the runtime cache (``runtime.cache_dir``/``tuning``), so a
restart serves sooner: the measurement (:func:`agent.inference.tuning.tune_batch_size`) costs up
to half a second of every load, and its result depends only on what the key names.

The key is the model file (its resolved path, size and modification time: version folders are
not rewritten in place), the placement, the instance count and threads, the batch-size limit,
the processors and the edgefleet release; anything else changed measures again. Like the rest
of the cache it is a convenience: a file that cannot be read or written is measured past, never
an error. Delete the folder to measure again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.inference.tuning import BatchTuning
from common import __version__

log = logging.getLogger("edgefleet.agent")

FOLDER = "tuning"


@dataclass(frozen=True)
class TuningKey:
    model_file: Path
    placement: str
    instances: int
    threads: int
    limit: int
    cpus: int

    def fields(self) -> dict[str, Any]:
        stat = self.model_file.stat()
        return {
            "model_file": str(self.model_file.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "placement": self.placement,
            "instances": self.instances,
            "threads": self.threads,
            "limit": self.limit,
            "cpus": self.cpus,
            "edgefleet": __version__,
        }


def _path(cache_dir: Path, fields: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return cache_dir / FOLDER / f"{digest[:32]}.json"


def load(cache_dir: Path, key: TuningKey) -> BatchTuning | None:
    """The measurement kept for ``key``, or None (none kept, or unreadable)."""
    try:
        fields = key.fields()
        doc = json.loads(_path(cache_dir, fields).read_text())
        if doc.get("key") != fields:  # a digest collision, or a file written by hand
            return None
        return BatchTuning(
            rows_per_s={int(b): float(r) for b, r in doc["rows_per_s"].items()},
            max_batch_size=int(doc["max_batch_size"]),
            elapsed_s=float(doc["elapsed_s"]),
            failed={int(b): str(e) for b, e in doc.get("failed", {}).items()},
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.info("tuning cache entry unusable: measuring again", extra={"reason": str(exc)})
        return None


def store(cache_dir: Path, key: TuningKey, tuning: BatchTuning) -> None:
    """Keep ``tuning`` for ``key``, atomically; a cache that cannot be written is passed over."""
    try:
        fields = key.fields()
        path = _path(cache_dir, fields)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "key": fields,
            "rows_per_s": {str(b): r for b, r in tuning.rows_per_s.items()},
            "max_batch_size": tuning.max_batch_size,
            "elapsed_s": tuning.elapsed_s,
            "failed": {str(b): e for b, e in tuning.failed.items()},
        }
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(doc))
        os.replace(partial, path)
    except OSError as exc:
        log.info("tuning cache not written", extra={"reason": str(exc)})
