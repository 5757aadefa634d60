"""Artifact downloads: streamed to a staging file, bounded, resumed, verified before use, and
installed into the model store as a new version's directory."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from agent.fleet.settings import FleetSettings
from agent.fleet.store import ModelStore, is_disk_full
from common.files import fsync_path
from common.protocol.errors import ProtocolError, Rejection
from common.protocol.messages import FileRef, UpdateState
from common.protocol.verify import VerifiedManifest

log = logging.getLogger("edgefleet.agent.fleet")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


async def fetch(
    client: httpx.AsyncClient,
    ref: FileRef,
    staging: Path,
    *,
    max_bytes: int,
    attempts: int,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Download ``ref`` into ``staging``; return the verified file.

    A partial file from an earlier attempt (or an earlier process) is resumed with a Range
    request. Raises :class:`ProtocolError` (oversize, size_mismatch, digest_mismatch,
    download_failed, disk_full); a failed file is deleted.
    """
    if ref.size > max_bytes:
        raise ProtocolError(
            Rejection.OVERSIZE, f"{ref.name} is {ref.size} bytes, the limit is {max_bytes}"
        )
    done = staging / f"{ref.sha256}.blob"
    if done.is_file():
        # Verified when it was downloaded, but a power loss can tear a file after that: hashed
        # again before it is used (one read of the file, cheaper than a failed sequence).
        if await asyncio.to_thread(_matches, done, ref):
            return done
        log.warning("staged file damaged, downloading it again", extra={"file": ref.name})
        done.unlink()
    part = staging / f"{ref.sha256}.part"
    resumed = part.is_file() and part.stat().st_size > 0
    try:
        return await _download(client, ref, part, done, attempts, progress)
    except ProtocolError as exc:
        if not resumed or exc.code not in (Rejection.SIZE_MISMATCH, Rejection.DIGEST_MISMATCH):
            raise
        # The bytes kept on disk from before (a resumed partial file, torn by a power loss)
        # may be what is wrong, not the artifact: once more from scratch before failing.
        log.warning(
            "downloaded file does not verify, once more from scratch",
            extra={"file": ref.name, "error": exc.message},
        )
        return await _download(client, ref, part, done, attempts, progress)


def _matches(path: Path, ref: FileRef) -> bool:
    return path.stat().st_size == ref.size and _sha256(path) == ref.sha256


async def _download(
    client: httpx.AsyncClient,
    ref: FileRef,
    part: Path,
    done: Path,
    attempts: int,
    progress: Callable[[int], None] | None,
) -> Path:
    last_error = ""
    for attempt in range(attempts):
        try:
            await _fetch_once(client, ref, part, progress)
            break
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "download interrupted, will resume",
                extra={"file": ref.name, "attempt": attempt + 1, "error": last_error},
            )
            await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        except ProtocolError:
            part.unlink(missing_ok=True)
            raise
        except OSError as exc:
            part.unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:
                raise ProtocolError(
                    Rejection.DISK_FULL, f"no space left writing {ref.name}"
                ) from exc
            raise
    else:
        raise ProtocolError(
            Rejection.DOWNLOAD_FAILED, f"{ref.name}: {attempts} attempts failed ({last_error})"
        )
    size = part.stat().st_size
    if size != ref.size:
        part.unlink(missing_ok=True)
        raise ProtocolError(
            Rejection.SIZE_MISMATCH, f"{ref.name} is {size} bytes, the manifest says {ref.size}"
        )
    actual = await asyncio.to_thread(_sha256, part)
    if actual != ref.sha256:
        part.unlink(missing_ok=True)
        raise ProtocolError(
            Rejection.DIGEST_MISMATCH,
            f"{ref.name} has sha256 {actual}, the manifest says {ref.sha256}",
        )
    # Durable before and after the rename: a power loss must not leave a ``.blob`` whose
    # name promises bytes that never reached the disk.
    await asyncio.to_thread(fsync_path, part)
    part.replace(done)
    await asyncio.to_thread(fsync_path, done.parent)
    return done


async def _fetch_once(
    client: httpx.AsyncClient, ref: FileRef, part: Path, progress: Callable[[int], None] | None
) -> None:
    offset = part.stat().st_size if part.exists() else 0
    if offset > ref.size:
        part.unlink()
        offset = 0
    if offset == ref.size and offset:
        return
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    async with client.stream("GET", ref.url, headers=headers) as resp:
        if resp.status_code == 206:
            start = resp.headers.get("content-range", "").removeprefix("bytes ").split("-")[0]
            if start != str(offset):
                raise ProtocolError(
                    Rejection.DOWNLOAD_FAILED,
                    f"{ref.name}: server resumed at {start}, not {offset}",
                )
        elif resp.status_code == 200:
            offset = 0  # the server ignored the range: start over
        elif resp.status_code >= 500 or resp.status_code in (408, 429):
            resp.raise_for_status()  # worth another attempt
        else:
            raise ProtocolError(
                Rejection.DOWNLOAD_FAILED, f"{ref.name}: HTTP {resp.status_code} from {ref.url}"
            )
        written = offset
        with part.open("r+b" if offset else "wb") as fh:
            fh.seek(offset)
            fh.truncate()
            async for chunk in resp.aiter_bytes():  # as received: a crash keeps what arrived
                written += len(chunk)
                if written > ref.size:
                    raise ProtocolError(
                        Rejection.OVERSIZE,
                        f"{ref.name}: the server sent more than the manifest's {ref.size} bytes",
                    )
                fh.write(chunk)
                if progress is not None:
                    progress(written)


async def stage_update(
    vm: VerifiedManifest,
    http: httpx.AsyncClient,
    store: ModelStore,
    settings: FleetSettings,
    served: Callable[[], list[int]],
    say: Callable[..., None],
) -> Path:
    """Download the files of a verified manifest's variant (and its golden sample) and install
    them as the version's directory; the directory, at once if that version is installed
    already. ``served`` gives the model's versions being served, which the store keeps;
    ``say`` reports progress, at most once a second.

    Raises:
        ProtocolError: a download failed, or the device's storage refused it (``disk_full``).
    """
    m = vm.manifest
    refs = list(vm.variant.files) + ([m.golden] if m.golden else [])
    try:
        if await asyncio.to_thread(store.installed, m.model, m.version, refs):
            return store.version_dir(m.model, m.version)
        total = sum(r.size for r in refs) or 1
        done = 0
        say(UpdateState.DOWNLOADING, progress=0.0, bytes_done=0, bytes_total=total)
        files: dict[str, Path] = {}
        last_report = time.monotonic()

        for ref in refs:

            def progress(written: int, before: int = done) -> None:
                nonlocal last_report
                if time.monotonic() - last_report >= 1.0:  # one progress event a second at most
                    last_report = time.monotonic()
                    fetched = min(total, before + written)
                    say(
                        UpdateState.DOWNLOADING,
                        progress=fetched / total,
                        bytes_done=fetched,
                        bytes_total=total,
                    )

            files[ref.name] = await fetch(
                http,
                ref,
                store.staging,
                max_bytes=settings.max_artifact_bytes,
                attempts=settings.download_attempts,
                progress=progress,
            )
            done += ref.size
        say(UpdateState.DOWNLOADING, progress=1.0, bytes_done=total, bytes_total=total)
        store.pin(m.model, served())
        version_dir = await asyncio.to_thread(store.install, m.model, m.version, files, refs)
        for path in files.values():
            path.unlink(missing_ok=True)
        return version_dir
    except OSError as exc:
        # the device's storage, not the manifest: reported, and tried again later
        full = is_disk_full(exc)
        raise ProtocolError(
            Rejection.DISK_FULL if full else Rejection.DOWNLOAD_FAILED,
            f"storing the update failed: {exc.strerror or exc} ({exc.filename})",
        ) from exc
